/*
 * run_corpus.c -- a main() for a fuzz harness without libFuzzer: every file in the directories (or
 * the files) named on the command line goes once through LLVMFuzzerTestOneInput, in name order. A
 * harness reports a finding by aborting, so a clean exit means every input passed. CTest uses it to
 * replay the seed corpora in every build; it also replays a crash file that libFuzzer wrote, under gdb
 * or a build without clang.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path)
{
    FILE *file = fopen(path, "rb");
    if (!file) {
        perror(path);
        return 1;
    }
    size_t capacity = 4096, size = 0;
    uint8_t *data = malloc(capacity);
    for (size_t got; data && (got = fread(data + size, 1, capacity - size, file)) > 0;) {
        size += got;
        if (size == capacity) {
            uint8_t *grown = realloc(data, capacity *= 2);
            if (!grown)
                free(data);
            data = grown;
        }
    }
    int failed = !data || ferror(file);
    fclose(file);
    if (failed) {
        fprintf(stderr, "%s: cannot read it\n", path);
        free(data);
        return 1;
    }
    /* An exact-size copy, so that AddressSanitizer sees a read past the input's end. */
    uint8_t *input = malloc(size ? size : 1);
    if (!input) {
        free(data);
        return 1;
    }
    memcpy(input, data, size);
    free(data);
    LLVMFuzzerTestOneInput(input, size);
    free(input);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The regular files of a directory, in name order. */
static int run_directory(const char *directory, size_t *count)
{
    DIR *listing = opendir(directory);
    if (!listing) {
        perror(directory);
        return 1;
    }
    char **paths = NULL;
    size_t path_count = 0;
    int failures = 0;
    for (struct dirent *entry; (entry = readdir(listing));) {
        if (entry->d_name[0] == '.')
            continue;
        char **grown = realloc(paths, (path_count + 1) * sizeof *paths);
        if (!grown) {
            failures++;
            break;
        }
        paths = grown;
        size_t length = strlen(directory) + strlen(entry->d_name) + 2;
        char *path = malloc(length);
        if (!path) {
            failures++;
            break;
        }
        snprintf(path, length, "%s/%s", directory, entry->d_name);
        paths[path_count++] = path;
    }
    closedir(listing);
    qsort(paths, path_count, sizeof *paths, by_name);
    for (size_t i = 0; i < path_count; i++) {
        struct stat status;
        if (stat(paths[i], &status) == 0 && S_ISREG(status.st_mode)) {
            failures += run_file(paths[i]);
            (*count)++;
        }
        free(paths[i]);
    }
    free(paths);
    return failures;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIRECTORY_OR_FILE...\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    size_t count = 0;
    int failures = 0;
    for (int i = 1; i < argc; i++) {
        struct stat status;
        if (stat(argv[i], &status) == 0 && S_ISDIR(status.st_mode)) {
            failures += run_directory(argv[i], &count);
        } else {
            failures += run_file(argv[i]);
            count++;
        }
    }
    printf("%zu input(s) run, %d unreadable\n", count, failures);
    return failures || count == 0 ? 1 : 0;
}
