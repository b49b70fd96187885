// slow_writer.cu -- the kernels of the GPU tests, compiled to PTX (slow_writer_ptx.h) with
//   scripts/generate-gpu-test-ptx.sh
// so that the tests need no CUDA compiler: the driver compiles the PTX when the test loads it.

extern "C" __global__ void slow_fill(unsigned int *data, unsigned long long words, unsigned int pattern,
                                     unsigned long long spin_cycles)
{
    // One block of threads walks the buffer, pausing between rounds, so the fill lasts long enough
    // for the host to free the buffer and ask for memory while the kernel still writes.
    for (unsigned long long base = 0; base < words; base += blockDim.x) {
        unsigned long long start = clock64();
        while (clock64() - start < spin_cycles) {
        }
        unsigned long long index = base + threadIdx.x;
        if (index < words)
            data[index] = pattern;
    }
}

extern "C" __global__ void fill_words(unsigned int *data, unsigned long long words, unsigned int pattern)
{
    unsigned long long index = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (; index < words; index += stride)
        data[index] = pattern;
}

// Counts the words that differ from `pattern` into *mismatches.
extern "C" __global__ void check_words(const unsigned int *data, unsigned long long words, unsigned int pattern,
                                       unsigned long long *mismatches)
{
    unsigned long long index = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long bad = 0;
    for (; index < words; index += stride)
        bad += data[index] != pattern;
    if (bad)
        atomicAdd(mismatches, bad);
}
