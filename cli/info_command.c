/*
 * info_command.c -- gpumem info: what the backend sees, or why it sees nothing.
 */
#include "gpumem.h"

#include "commands.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gm_command_info(int argc, char **argv)
{
    gm_device_arguments device_arguments = {0};
    for (int i = 0; i < argc; i++) {
        int taken = gm_take_device_argument(&device_arguments, argc, argv, &i);
        if (taken < 0)
            return GM_EXIT_USAGE;
        if (!taken && (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))) {
            printf("usage: gpumem info [--backend sim|host|cuda] [--capacity BYTES] [--conf KEY:VALUE,...]\n");
            return 0;
        }
        if (!taken) {
            fprintf(stderr, "gpumem info: unknown argument '%s'\n", argv[i]);
            return GM_EXIT_USAGE;
        }
    }
    char *configuration = gm_device_configuration(&device_arguments, NULL);
    if (!configuration)
        return GM_EXIT_ERROR;
    gm_allocator *allocator = NULL;
    gm_status status = gm_create_from_environment(configuration, &allocator);
    free(configuration);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem info: %s: %s\n", gm_strerror(status), gm_last_error());
        return status == GM_ERROR_BAD_CONFIG ? GM_EXIT_USAGE : GM_EXIT_ERROR;
    }
    gm_device_info info;
    status = gm_get_device_info(allocator, &info);
    gm_destroy(allocator, NULL);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem info: %s: %s\n", gm_strerror(status), gm_last_error());
        return GM_EXIT_ERROR;
    }
    printf("backend         %s\n", info.backend);
    if (info.driver_version)
        printf("driver          CUDA %d.%d\n", info.driver_version / 1000, (info.driver_version % 1000) / 10);
    printf("devices         %d\n", info.device_count);
    printf("device %-8d %s\n", info.device, info.name);
    printf("memory          %.1f MiB total, %.1f MiB free\n", (double)info.total_bytes / 1048576.0,
           (double)info.free_bytes / 1048576.0);
    printf("virtual memory  %s, granularity %" PRIu64 " KiB\n", info.virtual_memory ? "supported" : "not supported",
           info.granularity / 1024);
    printf("engine          %s\n", info.engine);
    return GM_EXIT_OK;
}
