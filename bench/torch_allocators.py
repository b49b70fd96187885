"""The allocators PyTorch benchmarks compare, each as the environment of a fresh process.

    from torch_allocators import SETTINGS, environment
    subprocess.run([...], env=environment("gpumem"))

torch-native and torch-expandable: PyTorch's allocator without and with expandable_segments:True;
gpumem: GPUMEM_TORCH=1 with gpumem's python folder first on PYTHONPATH (its sitecustomize installs
gpumem when torch is imported, so the unmodified script runs on it); gpumem-compact: the same with
compact_min:2MiB (docs/engine.md, "Compaction"); gpumem-fine: the same with max_chunk_size:8MiB,move_slack:0.01
(small chunks, and room for the layout to settle: docs/engine.md); gpumem-stitch: stitch:true (a request laid
across second mappings of pinned chunks' free end and start: docs/engine.md, "Stitching"); gpumem-unstitched:
stitch:false (the same without it, whatever the default); gpumem-whole:
chunk_room_share:0 (chunks of up to max_chunk_size however full the device, as before the room share).
"""
import os

PYTHON_FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
SETTINGS = {
    "torch-native": {},
    "torch-expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "gpumem": {"GPUMEM_TORCH": "1"},
    "gpumem-compact": {"GPUMEM_TORCH": "compact_min:2MiB"},
    "gpumem-fine": {"GPUMEM_TORCH": "max_chunk_size:8MiB,move_slack:0.01"},
    "gpumem-stitch": {"GPUMEM_TORCH": "stitch:true"},
    "gpumem-unstitched": {"GPUMEM_TORCH": "stitch:false"},
    "gpumem-whole": {"GPUMEM_TORCH": "chunk_room_share:0"},
}


def environment(allocator):
    """os.environ with ALLOCATOR's settings (a name of SETTINGS)."""
    env = dict(os.environ, **SETTINGS[allocator])
    if "GPUMEM_TORCH" in SETTINGS[allocator]:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [PYTHON_FOLDER, os.environ.get("PYTHONPATH")]))
    return env
