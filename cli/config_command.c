/*
 * config_command.c -- gpumem config: what the GPUMEM_CONF keys mean, and whether a configuration
 * string is valid before a long job finds out at its first allocation.
 *
 *   gpumem config                  every key, what it does and its default
 *   gpumem config KEY...           those keys only
 *   gpumem config --check [CONF]   parse CONF exactly as gm_create does, creating no allocator: each key
 *                                  given with its meaning, or the error; without CONF, $GPUMEM_CONF
 *                                  and $GPUMEM_TORCH (the PyTorch adapter's keys over GPUMEM_CONF's)
 *
 * The check runs the library's own parser (base/options.c), and opens a simulated device as gm_create
 * would, so it accepts and refuses what an allocator would, with the same message.
 */
#include "gpumem.h"

#include "backend/backend.h"
#include "base/options.h"
#include "commands.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_usage(FILE *out)
{
    fputs("usage: gpumem config [KEY...]\n"
          "       gpumem config --check [KEY:VALUE,...]   (without it: $GPUMEM_CONF and $GPUMEM_TORCH)\n",
          out);
}

static int print_keys(int count, char **keys)
{
    for (int i = 0; i < count; i++) {
        if (!gm_option_help(keys[i])) {
            fprintf(stderr, "gpumem config: unknown key '%s' (gpumem config lists every key)\n", keys[i]);
            return GM_EXIT_USAGE;
        }
    }
    for (int i = 0; i < count; i++)
        printf("  %-22s %s\n", keys[i], gm_option_help(keys[i]));
    return GM_EXIT_OK;
}

/* Each key:value of a configuration the parser accepted, with the key's meaning. */
static void print_pairs(const char *configuration)
{
    const char *cursor = configuration;
    while (*cursor) {
        cursor += strspn(cursor, " \t\n"); /* the parser trims each pair */
        size_t length = strcspn(cursor, ",");
        while (length && strchr(" \t\n", cursor[length - 1]))
            length--;
        int key_length = (int)strcspn(cursor, ":");
        if ((size_t)key_length < length) {
            char key[64];
            snprintf(key, sizeof key, "%.*s", key_length, cursor);
            const char *help = gm_option_help(key);
            printf("  %-22s %-10.*s %s\n", key, (int)(length - (size_t)key_length - 1), cursor + key_length + 1,
                   help ? help : "");
        }
        cursor += strcspn(cursor, ",");
        if (*cursor == ',')
            cursor++;
    }
}

/* A simulated device (sim, host) is made from the capacity and page size when the allocator is
 * created, and refused then if it cannot be (a page larger than the device, too many pages): one is
 * opened and closed here, so that the check refuses what gm_create would. Its device index is left
 * out (device 0): a configuration checked without naming a backend may be meant for the PyTorch
 * adapter's GPUs. The cuda backend's device is the GPU, which this machine may not have: its keys are
 * only parsed. */
static gm_status check_simulated_device(const gm_options *options)
{
    if (strcmp(options->backend, "sim") && strcmp(options->backend, "host"))
        return GM_OK;
    gm_backend_config config = gm_backend_config_of(options);
    config.device = 0;
    gm_backend *backend = NULL;
    gm_status status = gm_backend_open(&config, &backend);
    if (status == GM_OK)
        gm_backend_close(backend);
    return status;
}

/* Apply `configuration` on top of *options, as gm_create_from_environment applies its overrides. */
static int check(gm_options *options, const char *configuration, const char *origin)
{
    if (gm_options_parse(options, configuration) != GM_OK || check_simulated_device(options) != GM_OK) {
        fprintf(stderr, "gpumem config: %s is not valid: %s\n", origin, gm_last_error());
        return GM_EXIT_ERROR;
    }
    if (!*configuration) {
        printf("%s is empty: every key has its default (gpumem config lists them)\n", origin);
        return GM_EXIT_OK;
    }
    printf("%s is valid:\n", origin);
    print_pairs(configuration);
    return GM_EXIT_OK;
}

/* GPUMEM_CONF, and GPUMEM_TORCH's keys over it. */
static int check_environment(void)
{
    const char *conf = getenv("GPUMEM_CONF");
    const char *torch = gm_torch_configuration();
    if (!conf && !torch) {
        printf("no keys in GPUMEM_CONF or GPUMEM_TORCH: every key has its default (gpumem config lists them)\n");
        return GM_EXIT_OK;
    }
    gm_options options;
    gm_options_default(&options);
    int status = conf ? check(&options, conf, "GPUMEM_CONF") : GM_EXIT_OK;
    if (status == GM_EXIT_OK && torch)
        status = check(&options, torch, conf ? "GPUMEM_TORCH over GPUMEM_CONF" : "GPUMEM_TORCH");
    return status;
}

int gm_command_config(int argc, char **argv)
{
    if (argc == 0) {
        fputs(gm_config_help(), stdout);
        return GM_EXIT_OK;
    }
    if (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        print_usage(stdout);
        return GM_EXIT_OK;
    }
    if (!strcmp(argv[0], "--check")) {
        if (argc > 2) {
            fprintf(stderr, "gpumem config: --check takes one configuration string, not %d\n", argc - 1);
            print_usage(stderr);
            return GM_EXIT_USAGE;
        }
        if (argc == 2) {
            gm_options options;
            gm_options_default(&options);
            return check(&options, argv[1], "the configuration");
        }
        return check_environment();
    }
    for (int i = 0; i < argc; i++) {
        if (argv[i][0] == '-') {
            fprintf(stderr, "gpumem config: unknown option '%s'\n", argv[i]);
            print_usage(stderr);
            return GM_EXIT_USAGE;
        }
    }
    return print_keys(argc, argv);
}
