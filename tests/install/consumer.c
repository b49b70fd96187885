/* consumer.c -- a program outside gpumem built against an installed gpumem (through pkg-config and
 * through find_package; see tests/test_install.sh): create an allocator on the simulated device,
 * allocate, free, print the summary's first line (under its opening rule). Exits 0 only if all of it
 * worked. */
#include <gpumem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failed(const char *what, gm_status status) {
    fprintf(stderr, "consumer: %s: %s: %s\n", what, gm_strerror(status), gm_last_error());
    return 1;
}

int main(void) {
    gm_allocator *allocator;
    gm_status status = gm_create("backend:sim,capacity:1GiB", &allocator);
    if (status != GM_OK)
        return failed("gm_create", status);
    void *pointer = NULL;
    if ((status = gm_malloc(allocator, 3 << 20, 0, &pointer)) != GM_OK || pointer == NULL)
        return failed("gm_malloc", status);
    if ((status = gm_free(allocator, pointer)) != GM_OK)
        return failed("gm_free", status);
    size_t needed = 0;
    status = gm_summary(allocator, NULL, 0, &needed);
    if (status != GM_ERROR_BUFFER_TOO_SMALL && status != GM_OK)
        return failed("gm_summary (size)", status);
    char *summary = malloc(needed);
    if (summary == NULL || (status = gm_summary(allocator, summary, needed, NULL)) != GM_OK)
        return failed("gm_summary", status);
    const char *line = summary;
    if (strncmp(line, "|=", 2) == 0 && strchr(line, '\n') != NULL)  /* the table opens with a rule */
        line = strchr(line, '\n') + 1;
    printf("%.*s\n", (int)strcspn(line, "\n"), line);
    free(summary);
    size_t live = 1;
    gm_destroy(allocator, &live);
    if (live != 0) {
        fprintf(stderr, "consumer: %zu allocations still live\n", live);
        return 1;
    }
    printf("consumer: gpumem %s works\n", GPUMEM_VERSION);
    return 0;
}
