/*
 * pattern.h -- data patterns for the host-backend tests. A live allocation is stamped with a word
 * derived from its identity every 256 bytes (and at its last word); blocks are 512-byte granular,
 * so two overlapping live allocations always share a stamped word and the later stamp shows up as
 * corruption of the earlier one when it is checked.
 */
#ifndef GM_TEST_PATTERN_H
#define GM_TEST_PATTERN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PATTERN_STRIDE 256

static inline uint64_t pattern_word(uint64_t identity, size_t offset)
{
    return (identity * 0x9E3779B97F4A7C15ull) ^ (uint64_t)offset;
}

static inline void pattern_stamp(void *pointer, size_t size, uint64_t identity)
{
    char *bytes = pointer;
    for (size_t offset = 0; offset + 16 <= size; offset += PATTERN_STRIDE) {
        uint64_t word = pattern_word(identity, offset);
        memcpy(bytes + offset, &word, 8);
    }
    if (size >= 8) {
        uint64_t word = pattern_word(identity, size - 8);
        memcpy(bytes + size - 8, &word, 8);
    } else {
        memset(bytes, (int)(identity & 0xff), size);
    }
}

/* 1 if the stamp is intact. */
static inline int pattern_intact(const void *pointer, size_t size, uint64_t identity)
{
    const char *bytes = pointer;
    uint64_t word;
    for (size_t offset = 0; offset + 16 <= size; offset += PATTERN_STRIDE) {
        memcpy(&word, bytes + offset, 8);
        if (word != pattern_word(identity, offset))
            return 0;
    }
    if (size >= 8) {
        memcpy(&word, bytes + size - 8, 8);
        return word == pattern_word(identity, size - 8);
    }
    for (size_t i = 0; i < size; i++)
        if ((unsigned char)bytes[i] != (identity & 0xff))
            return 0;
    return 1;
}

#endif
