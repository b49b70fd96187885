/*
 * nvml.h -- the GPUs as their driver sees them (NVML, loaded at run time: no build dependency).
 */
#ifndef GM_NVML_H
#define GM_NVML_H

#include "gpumem.h"

#include <stddef.h>
#include <stdint.h>

typedef struct gm_gpu_reading {
    int index;
    char name[96];
    uint64_t total_bytes;
    uint64_t used_bytes;
    int utilization_percent; /* -1 when the driver does not say */
    int temperature_celsius; /* -1 when the driver does not say */
} gm_gpu_reading;

/* Read up to `capacity` GPUs into `gpus`; *count_out: how many. GM_ERROR_NO_DEVICE, with the reason
 * in gm_last_error(), when NVML cannot be loaded or initialised (no driver, no GPU). */
gm_status gm_read_gpus(gm_gpu_reading *gpus, size_t capacity, size_t *count_out);

/* The driver's version ("550.54.15") into `driver` and the CUDA version it supports (12040 for 12.4) into
 * *cuda_version_out; "?" and 0 where NVML does not say. GM_ERROR_NO_DEVICE when NVML is not there. */
gm_status gm_gpu_driver_versions(char *driver, size_t size, int *cuda_version_out);

/* What gpumem doctor reports of a GPU beyond its memory; -1 where the driver does not say. */
typedef struct gm_gpu_details {
    int persistence_mode;               /* 1 on, 0 off */
    int ecc_mode;                       /* 1 on, 0 off */
    int mig_mode;                       /* 1 on, 0 off */
    int pcie_generation, pcie_max_generation;
    int pcie_width, pcie_max_width;     /* lanes */
    int processes;                      /* compute processes holding memory on it */
    uint64_t processes_bytes;           /* their memory, where the driver says */
} gm_gpu_details;

/* The details of GPU `index` (NVML's index, as in gm_gpu_reading). GM_ERROR_NO_DEVICE when NVML is not
 * there or does not know the index. */
gm_status gm_read_gpu_details(int index, gm_gpu_details *details_out);

/* A process using a GPU, as NVML reports it (its pid in NVML's view: the host's pid namespace). */
typedef struct gm_gpu_process {
    long pid;
    uint64_t used_bytes; /* 0 when the driver does not say (for instance under MIG or WDDM) */
} gm_gpu_process;

/* The compute processes on the GPU with PCI bus id `pci_bus_id` (as cuDeviceGetPCIBusId gives it), up to
 * `capacity` of them; *count_out: how many were written. GM_ERROR_NO_DEVICE, with the reason, when NVML
 * is not there or does not know the GPU. */
gm_status gm_gpu_processes(const char *pci_bus_id, gm_gpu_process *processes, size_t capacity, size_t *count_out);

#endif
