/*
 * exporter.h -- what the two halves of `gpumem exporter` share: exporter_command.c reads the
 * arguments, scrapes and writes the textfile; exporter_http.c (built only with libmicrohttpd) serves
 * the scrape over HTTP.
 */
#ifndef GM_EXPORTER_H
#define GM_EXPORTER_H

#include "report/prometheus.h"

#include <signal.h>
#include <stdbool.h>

/* One scrape: every region of this user (stale and refused ones counted), the host's and each
 * process tree's memory, the GPUs through NVML, rendered as Prometheus text into `buffer`. Never fails
 * for want of NVML or /proc; GM_ERROR_OUT_OF_MEMORY when host memory runs out. */
gm_status gm_exporter_scrape(gm_text_buffer *buffer);

/* Block SIGINT and SIGTERM in the calling thread (and the threads it starts), so that they can be
 * waited for; `signals_out` receives the set. */
void gm_exporter_block_stop_signals(sigset_t *signals_out);

/* Serve GET /metrics on `listen_address` ("HOST:PORT", "[IPV6]:PORT") until SIGINT or SIGTERM; refuse
 * a host that is not a loopback address unless `allow_remote`. Returns the exit status. */
int gm_exporter_serve(const char *listen_address, bool allow_remote);

#endif
