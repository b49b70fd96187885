/*
 * run_report.h -- the report of `gpumem run --report` and the tuning of `gpumem run --tune`: made from
 * the history the command's allocators wrote at exit into the run's output folder (see run_command.c).
 */
#ifndef GM_RUN_REPORT_H
#define GM_RUN_REPORT_H

/* Write the report of the history files in `folder` to `report_path`; a GM_EXIT_* status. */
int gm_run_report(const char *folder, const char *report_path);

/* Compare the configurations of `gpumem tune` on the busiest history in `folder` (with `conf`, the run's
 * --conf, under each; may be NULL), on standard error; a GM_EXIT_* status. */
int gm_run_tune(const char *folder, const char *conf);

/* Remove the folder and the files in it. */
void gm_run_report_cleanup(const char *folder);

#endif
