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

#endif
