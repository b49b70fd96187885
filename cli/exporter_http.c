/*
 * exporter_http.c -- gpumem exporter's HTTP side, through libmicrohttpd (built only when pkg-config
 * finds it; the textfile mode needs none of this).
 *
 * The listening socket is made here (so that a bad host, a port in use and the port picked for port 0
 * are reported precisely) and handed to libmicrohttpd, which parses HTTP in its own thread and calls
 * answer() per request: GET or HEAD /metrics scrapes at that moment (gm_exporter_scrape), / is a page
 * linking to it, anything else 404, and a method other than GET or HEAD 405. Binding to an address
 * outside loopback (127.0.0.0/8, ::1) is refused unless --allow-remote: the metrics name processes and
 * their memory. The main thread blocks SIGINT and SIGTERM before starting the daemon (whose thread
 * inherits the mask) and waits for one of them, then stops the daemon.
 */
#include "gpumem.h"

#include "commands.h"
#include "exporter.h"

#include <microhttpd.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#if MHD_VERSION >= 0x00097002
typedef enum MHD_Result handler_result;
#else
typedef int handler_result;
#endif

#define HOME_PAGE                                                                                        \
    "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>gpumem exporter</title></head>\n"        \
    "<body><h1>gpumem exporter</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n"

/* ---------------------------------------------------------------- requests */

/* Queue a response owning `text` (malloc'd; freed by libmicrohttpd, or here if it cannot be made). */
static handler_result respond(struct MHD_Connection *connection, unsigned int code, const char *content_type,
                              char *text, size_t length)
{
    struct MHD_Response *response = MHD_create_response_from_buffer_with_free_callback(length, text, free);
    if (!response) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    handler_result result = MHD_queue_response(connection, code, response);
    MHD_destroy_response(response);
    return result;
}

static handler_result respond_text(struct MHD_Connection *connection, unsigned int code, const char *content_type,
                                   const char *text)
{
    char *copy = strdup(text);
    return copy ? respond(connection, code, content_type, copy, strlen(copy)) : MHD_NO;
}

static handler_result respond_metrics(struct MHD_Connection *connection)
{
    gm_text_buffer buffer = {0};
    if (gm_exporter_scrape(&buffer) != GM_OK) {
        gm_text_buffer_free(&buffer);
        return respond_text(connection, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain; charset=utf-8",
                            "gpumem exporter: out of host memory\n");
    }
    if (!buffer.text)
        return respond_text(connection, MHD_HTTP_OK, GM_PROMETHEUS_CONTENT_TYPE, "");
    return respond(connection, MHD_HTTP_OK, GM_PROMETHEUS_CONTENT_TYPE, buffer.text, buffer.length);
}

/* The path of a request's target: the target itself, or the part after the authority of one in
 * absolute form ("http://host:port/metrics", which HTTP/1.1 servers must accept, RFC 9112 3.2.2). */
static const char *path_of(const char *url)
{
    const char *scheme_end = strncasecmp(url, "http://", 7) == 0 ? url + 7 : NULL;
    if (!scheme_end)
        return url;
    const char *path = strchr(scheme_end, '/');
    return path ? path : "/";
}

static handler_result answer(void *context, struct MHD_Connection *connection, const char *url, const char *method,
                             const char *version, const char *upload_data, size_t *upload_data_size,
                             void **request_state)
{
    (void)context, (void)version, (void)upload_data, (void)upload_data_size, (void)request_state;
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return respond_text(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain; charset=utf-8",
                            "method not allowed: GET or HEAD\n");
    url = path_of(url);
    if (!strcmp(url, "/metrics"))
        return respond_metrics(connection);
    if (!strcmp(url, "/"))
        return respond_text(connection, MHD_HTTP_OK, "text/html; charset=utf-8", HOME_PAGE);
    return respond_text(connection, MHD_HTTP_NOT_FOUND, "text/plain; charset=utf-8",
                        "not found: the metrics are at /metrics\n");
}

/* ---------------------------------------------------------------- the address */

/* "HOST:PORT" or "[IPV6]:PORT" into host and port; false (after saying why) when malformed. */
static bool split_address(const char *text, char *host, size_t host_size, char *port, size_t port_size)
{
    const char *colon;
    const char *host_start = text;
    size_t host_length;
    if (text[0] == '[') {
        const char *bracket = strchr(text, ']');
        colon = bracket && bracket[1] == ':' ? bracket + 1 : NULL;
        host_start = text + 1;
        host_length = bracket ? (size_t)(bracket - host_start) : 0;
    } else {
        colon = strrchr(text, ':');
        host_length = colon ? (size_t)(colon - text) : 0;
        if (colon && memchr(text, ':', host_length))
            colon = NULL; /* an IPv6 address without brackets */
    }
    const char *port_text = colon ? colon + 1 : "";
    char *end = NULL;
    errno = 0;
    long number = strtol(port_text, &end, 10);
    if (!colon || host_length == 0 || host_length >= host_size || !*port_text || *end || errno || number < 0 ||
        number > 65535 || port_text[0] == '-' || port_text[0] == '+') {
        fprintf(stderr, "gpumem exporter: --listen wants HOST:PORT (PORT 0 to 65535; an IPv6 address in "
                        "brackets, [::1]:9464), not '%s'\n", text);
        return false;
    }
    memcpy(host, host_start, host_length);
    host[host_length] = '\0';
    snprintf(port, port_size, "%ld", number);
    return true;
}

static bool is_loopback(const struct sockaddr *address)
{
    if (address->sa_family == AF_INET) {
        const struct sockaddr_in *ipv4 = (const struct sockaddr_in *)(const void *)address;
        return (ntohl(ipv4->sin_addr.s_addr) >> 24) == 127;
    }
    if (address->sa_family == AF_INET6) {
        const struct sockaddr_in6 *ipv6 = (const struct sockaddr_in6 *)(const void *)address;
        const uint8_t *bytes = ipv6->sin6_addr.s6_addr;
        return IN6_IS_ADDR_LOOPBACK(&ipv6->sin6_addr) || (IN6_IS_ADDR_V4MAPPED(&ipv6->sin6_addr) && bytes[12] == 127);
    }
    return false;
}

/* "127.0.0.1:9464" or "[::1]:9464" for `address`. */
static void describe(const struct sockaddr *address, socklen_t length, char *out, size_t size)
{
    char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
    getnameinfo(address, length, host, sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(out, size, address->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
}

/* The first address `host` names, checked against --allow-remote; the exit status on failure. */
static int resolve(const char *text, bool allow_remote, struct addrinfo **address_out)
{
    char host[256], port[8];
    if (!split_address(text, host, sizeof host, port, sizeof port))
        return GM_EXIT_USAGE;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    int failure = getaddrinfo(host, port, &hints, address_out);
    if (failure) {
        fprintf(stderr, "gpumem exporter: cannot listen on '%s': host '%s': %s\n", text, host, gai_strerror(failure));
        return GM_EXIT_USAGE;
    }
    if (!allow_remote && !is_loopback((*address_out)->ai_addr)) {
        char where[NI_MAXHOST + NI_MAXSERV + 4];
        describe((*address_out)->ai_addr, (*address_out)->ai_addrlen, where, sizeof where);
        fprintf(stderr, "gpumem exporter: %s is not a loopback address, so the metrics (processes and their "
                        "memory) would be open to the network: refused; give --allow-remote to serve them there\n",
                where);
        freeaddrinfo(*address_out);
        return GM_EXIT_USAGE;
    }
    return GM_EXIT_OK;
}

/* A socket listening on `address`; -1 (after saying why) if it cannot be had. */
static int listen_on(const struct addrinfo *address, const char *text)
{
    int descriptor = socket(address->ai_family, address->ai_socktype | SOCK_CLOEXEC, address->ai_protocol);
    if (descriptor < 0) {
        fprintf(stderr, "gpumem exporter: cannot make a socket for %s: %s\n", text, strerror(errno));
        return -1;
    }
    int on = 1;
    setsockopt(descriptor, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (bind(descriptor, address->ai_addr, address->ai_addrlen) != 0 || listen(descriptor, 64) != 0) {
        if (errno == EADDRINUSE)
            fprintf(stderr, "gpumem exporter: %s is already in use (another exporter?): pick another port with "
                            "--listen\n", text);
        else
            fprintf(stderr, "gpumem exporter: cannot listen on %s: %s\n", text, strerror(errno));
        close(descriptor);
        return -1;
    }
    return descriptor;
}

/* ---------------------------------------------------------------- serving */

/* At most 64 connections. A client that connects and sends nothing holds one until the timeout, so the
 * timeout is short -- 3 s, well inside Prometheus's default scrape timeout of 10 s -- lest clients that
 * stay idle hold every slot through a scrape. A scraper's kept-alive connection that times out between
 * scrapes is simply opened again. */
static struct MHD_Daemon *start_daemon(int descriptor, int family)
{
    unsigned int flags = MHD_USE_AUTO_INTERNAL_THREAD;
    if (family == AF_INET6)
        flags |= MHD_USE_IPv6;
    return MHD_start_daemon(flags, 0, NULL, NULL, answer, NULL, MHD_OPTION_LISTEN_SOCKET, descriptor,
                            MHD_OPTION_CONNECTION_TIMEOUT, 3u, MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_END);
}

int gm_exporter_serve(const char *listen_address, bool allow_remote)
{
    struct addrinfo *address = NULL;
    int status = resolve(listen_address, allow_remote, &address);
    if (status != GM_EXIT_OK)
        return status;
    int family = address->ai_family;
    int descriptor = listen_on(address, listen_address);
    freeaddrinfo(address);
    if (descriptor < 0)
        return GM_EXIT_ERROR;
    sigset_t signals;
    gm_exporter_block_stop_signals(&signals);
    struct MHD_Daemon *daemon = start_daemon(descriptor, family);
    if (!daemon) {
        fprintf(stderr, "gpumem exporter: libmicrohttpd could not start serving %s\n", listen_address);
        close(descriptor);
        return GM_EXIT_ERROR;
    }
    struct sockaddr_storage bound;
    socklen_t length = sizeof bound;
    char where[NI_MAXHOST + NI_MAXSERV + 4] = "?";
    if (getsockname(descriptor, (struct sockaddr *)&bound, &length) == 0)
        describe((struct sockaddr *)&bound, length, where, sizeof where);
    printf("listening on http://%s/metrics\n", where);
    fflush(stdout);
    int signal_number;
    while (sigwait(&signals, &signal_number) != 0)
        continue;
    MHD_stop_daemon(daemon); /* closes the listening socket */
    return GM_EXIT_OK;
}
