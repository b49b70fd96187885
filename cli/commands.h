/*
 * commands.h -- the subcommands of the gpumem command line and what they share.
 */
#ifndef GM_COMMANDS_H
#define GM_COMMANDS_H

#include <stdbool.h>
#include <stddef.h>

/* 4 and 5: gpumem doctor's worst finding is warn, fail (cli/doctor_command.c). */
enum {
    GM_EXIT_OK = 0,
    GM_EXIT_ERROR = 1,
    GM_EXIT_USAGE = 2,
    GM_EXIT_OUT_OF_MEMORY = 3,
    GM_EXIT_DOCTOR_WARN = 4,
    GM_EXIT_DOCTOR_FAIL = 5
};

/* Options every device-using command accepts; the configuration string they make. */
typedef struct gm_device_arguments {
    const char *backend;
    const char *capacity;
    const char *conf;
} gm_device_arguments;

/* If argv[*index] is a device option, consume it (and its value) and return 1; 0 if it is not one;
 * -1 after printing an error if its value is missing. */
int gm_take_device_argument(gm_device_arguments *arguments, int argc, char **argv, int *index);
/* "conf,backend:X,capacity:Y", then ",`addition`" when it is not NULL: a string of its own length (no
 * fixed buffer truncates a long --conf and drops the flags after it), to free(); NULL, after saying so on
 * stderr, when there is no host memory for it. */
char *gm_device_configuration(const gm_device_arguments *arguments, const char *addition);

/* The keys of GPUMEM_TORCH, which the PyTorch adapter applies over GPUMEM_CONF's; NULL when it is unset,
 * "1" (which only turns the adapter on) or off. */
const char *gm_torch_configuration(void);
/* Whether a GPUMEM_TORCH value turns the adapter off: unset, empty, 0, false, no or off (any case). */
bool gm_torch_setting_is_off(const char *setting);

/* Print `text` as a JSON string literal (quotes, backslashes and control characters escaped). */
void gm_print_json_string(const char *text);

int gm_command_replay(int argc, char **argv);
int gm_command_info(int argc, char **argv);
int gm_command_stats(int argc, char **argv);
int gm_command_top(int argc, char **argv);
int gm_command_summary(int argc, char **argv);
int gm_command_run(int argc, char **argv);
int gm_command_report(int argc, char **argv);

struct gm_trace;
/* The HTML report of a loaded trace (report_command.c), replayed on fresh allocators of `configuration`,
 * written to output_path; errors on stderr as "gpumem COMMAND: ...". The exit status. */
int gm_report_of_trace(const struct gm_trace *trace, const char *trace_path, const char *configuration,
                       const char *output_path, const char *command);
int gm_command_exporter(int argc, char **argv);
int gm_command_doctor(int argc, char **argv);
int gm_command_config(int argc, char **argv);
int gm_command_tune(int argc, char **argv);

#endif
