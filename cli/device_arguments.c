/*
 * device_arguments.c -- what the subcommands share: the --backend / --capacity / --conf options, and
 * JSON strings.
 */
#include "commands.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int gm_take_device_argument(gm_device_arguments *arguments, int argc, char **argv, int *index)
{
    static const char *const names[] = {"--backend", "--capacity", "--conf"};
    const char *argument = argv[*index];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(argument, names[i]) != 0)
            continue;
        if (*index + 1 >= argc) {
            fprintf(stderr, "gpumem: %s needs a value\n", argument);
            return -1;
        }
        const char *value = argv[++*index];
        if (i == 0)
            arguments->backend = value;
        else if (i == 1)
            arguments->capacity = value;
        else
            arguments->conf = value;
        return 1;
    }
    return 0;
}

char *gm_device_configuration(const gm_device_arguments *arguments, const char *addition)
{
    char *configuration = NULL;
    if (asprintf(&configuration, "%s%s%s%s%s%s%s", arguments->conf ? arguments->conf : "",
                 arguments->backend ? ",backend:" : "", arguments->backend ? arguments->backend : "",
                 arguments->capacity ? ",capacity:" : "", arguments->capacity ? arguments->capacity : "",
                 addition ? "," : "", addition ? addition : "") < 0) {
        fprintf(stderr, "gpumem: no host memory for the configuration\n");
        return NULL;
    }
    return configuration;
}

void gm_print_json_string(const char *text)
{
    putchar('"');
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*c == '"' || *c == '\\')
            printf("\\%c", *c);
        else if (*c < 0x20)
            printf("\\u%04x", *c);
        else
            putchar(*c);
    }
    putchar('"');
}

/* Whether `setting`, white space around it left out, is `word` (in any case). */
static bool trimmed_is(const char *setting, const char *word)
{
    while (isspace((unsigned char)*setting))
        setting++;
    size_t length = strlen(setting);
    while (length && isspace((unsigned char)setting[length - 1]))
        length--;
    return length == strlen(word) && !strncasecmp(setting, word, length);
}

bool gm_torch_setting_is_off(const char *setting)
{
    static const char *const off[] = {"", "0", "false", "no", "off"}; /* as python/gpumem/torch.py's _OFF */
    for (size_t i = 0; setting && i < sizeof off / sizeof off[0]; i++)
        if (trimmed_is(setting, off[i]))
            return true;
    return !setting;
}

const char *gm_torch_configuration(void)
{
    const char *keys = getenv("GPUMEM_TORCH");
    return keys && !gm_torch_setting_is_off(keys) && !trimmed_is(keys, "1") ? keys : NULL;
}
