/*
 * test_sharing.c -- memory shared with another process (gm_share, gm_open_shared, gm_close_shared).
 *
 * On the host backend a chunk is a memfd, so what another process maps is really the same memory: a
 * block stamped here reads the same through the other mapping, and a write there shows here. The other
 * process is this one (a second allocator) or a forked child, which takes the descriptors with
 * pidfd_getfd as a CUDA consumer would. Descriptors are exported once per chunk and closed when the
 * chunk goes back to the device; every bad input is refused with a clear error and changes nothing.
 */
#include "test.h"

#include "pattern.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1ull << 20)
#define BLOCKS 3
#define MOST_PIECES 256 /* a 2 GiB device: page-sized chunks (chunk_room_share) */

static const uint64_t block_sizes[BLOCKS] = {MIB / 2, 64 * MIB, 300 * MIB};

typedef struct shared {
    uint64_t offset;
    gm_shared_piece pieces[MOST_PIECES];
    size_t count;
} shared;

static gm_allocator *new_allocator(const char *config)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create(config, &allocator) == GM_OK);
    return allocator;
}

static shared share(gm_allocator *allocator, void *pointer)
{
    shared result = {0};
    REQUIRE(gm_share(allocator, pointer, &result.offset, result.pieces, MOST_PIECES, &result.count) == GM_OK);
    return result;
}

/* Another allocator of this process maps each block: the same bytes both ways. */
static void a_block_reads_and_writes_the_same_through_both_mappings(void)
{
    gm_allocator *sharer = new_allocator("backend:host,capacity:2GiB");
    gm_allocator *taker = new_allocator("backend:host,capacity:2GiB");
    for (int i = 0; i < BLOCKS; i++) {
        void *block = NULL;
        REQUIRE(gm_malloc(sharer, block_sizes[i], 0, &block) == GM_OK);
        pattern_stamp(block, block_sizes[i], (uint64_t)i + 1);
        shared view = share(sharer, block);
        CHECK(view.count >= 1);
        CHECK(i != 2 || view.count >= 3); /* 300 MiB lies in several chunks */
        void *mapped = NULL;
        REQUIRE(gm_open_shared(taker, getpid(), view.pieces, view.count, &mapped) == GM_OK); /* read below */
        char *there = (char *)mapped + view.offset;
        CHECK(pattern_intact(there, block_sizes[i], (uint64_t)i + 1));
        pattern_stamp(there, block_sizes[i], (uint64_t)i + 100);
        CHECK(pattern_intact(block, block_sizes[i], (uint64_t)i + 100));
        CHECK_OK(gm_close_shared(taker, mapped));
        CHECK(pattern_intact(block, block_sizes[i], (uint64_t)i + 100)); /* the sharer's memory stays */
        CHECK_OK(gm_free(sharer, block));
    }
    gm_stats stats;
    CHECK_OK(gm_get_stats(taker, &stats));
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 0); /* the other process's memory: not counted */
    CHECK_OK(gm_validate(sharer));
    CHECK_OK(gm_validate(taker));
    gm_destroy(taker, NULL);
    gm_destroy(sharer, NULL);
}

/* Each chunk is exported once: two blocks in one chunk, or one block shared twice, give one descriptor,
 * closed when the chunk goes back to the device. */
static void a_chunk_is_exported_once_and_closed_with_it(void)
{
    gm_allocator *sharer = new_allocator("backend:host,capacity:1GiB");
    void *first = NULL, *second = NULL;
    REQUIRE(gm_malloc(sharer, 4096, 0, &first) == GM_OK);
    REQUIRE(gm_malloc(sharer, 4096, 0, &second) == GM_OK); /* the same small-pool page */
    shared a = share(sharer, first), b = share(sharer, second), again = share(sharer, first);
    CHECK_EQ_INT(a.count, 1);
    CHECK_EQ_INT(b.pieces[0].descriptor, a.pieces[0].descriptor);
    CHECK_EQ_INT(again.pieces[0].descriptor, a.pieces[0].descriptor);
    CHECK(b.offset != a.offset);
    CHECK(fcntl(a.pieces[0].descriptor, F_GETFD) >= 0);
    CHECK_OK(gm_free(sharer, first));
    CHECK_OK(gm_free(sharer, second));
    CHECK_OK(gm_empty_cache(sharer));
    CHECK(fcntl(a.pieces[0].descriptor, F_GETFD) == -1); /* closed with its chunk */
    gm_destroy(sharer, NULL);
}

/* A forked child takes the parent's descriptors, reads the block and writes a mark the parent sees. */
static void a_child_process_maps_the_parents_block(void)
{
    gm_allocator *sharer = new_allocator("backend:host,capacity:1GiB");
    void *block = NULL;
    REQUIRE(gm_malloc(sharer, 100 * MIB, 0, &block) == GM_OK);
    pattern_stamp(block, 100 * MIB, 7);
    shared view = share(sharer, block);
    pid_t parent = getpid(), child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        gm_allocator *taker = NULL;
        void *mapped = NULL;
        int good = gm_create("backend:host,capacity:1GiB", &taker) == GM_OK &&
                   gm_open_shared(taker, parent, view.pieces, view.count, &mapped) == GM_OK &&
                   pattern_intact((char *)mapped + view.offset, 100 * MIB, 7);
        if (good)
            pattern_stamp((char *)mapped + view.offset, 100 * MIB, 8);
        if (!good)
            fprintf(stderr, "child: %s\n", gm_last_error());
        _exit(good ? 0 : 1);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(pattern_intact(block, 100 * MIB, 8));
    CHECK_OK(gm_free(sharer, block));
    gm_destroy(sharer, NULL);
}

static void bad_shares_are_refused(void)
{
    gm_allocator *sharer = new_allocator("backend:host,capacity:1GiB");
    void *block = NULL, *small = NULL;
    REQUIRE(gm_malloc(sharer, 300 * MIB, 0, &block) == GM_OK);
    REQUIRE(gm_malloc(sharer, 1024, 0, &small) == GM_OK);
    uint64_t offset = 0;
    size_t count = 0;
    gm_shared_piece piece;
    CHECK_STATUS(gm_share(sharer, block, &offset, &piece, 1, &count), GM_ERROR_BUFFER_TOO_SMALL);
    CHECK(count >= 3); /* how much room it needs */
    CHECK_MESSAGE("chunks");
    CHECK_STATUS(gm_share(sharer, (char *)block + 512, &offset, &piece, 1, &count), GM_ERROR_INVALID_POINTER);
    CHECK_STATUS(gm_share(sharer, block, NULL, &piece, 1, &count), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_share(NULL, block, &offset, &piece, 1, &count), GM_ERROR_INVALID_ARGUMENT);

    gm_allocator *taker = new_allocator("backend:host,capacity:1GiB");
    shared view = share(sharer, small);
    void *mapped = NULL;
    gm_shared_piece moved = view.pieces[0];
    moved.offset = 4096; /* not from offset 0 */
    CHECK_STATUS(gm_open_shared(taker, getpid(), &moved, 1, &mapped), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("back to back");
    gm_shared_piece partial = view.pieces[0];
    partial.size -= 4096; /* not whole pages */
    CHECK_STATUS(gm_open_shared(taker, getpid(), &partial, 1, &mapped), GM_ERROR_INVALID_ARGUMENT);
    gm_shared_piece unnamed = view.pieces[0];
    unnamed.descriptor = -1;
    CHECK_STATUS(gm_open_shared(taker, getpid(), &unnamed, 1, &mapped), GM_ERROR_INVALID_ARGUMENT);
    gm_shared_piece closed = view.pieces[0];
    closed.descriptor = 1000; /* no such descriptor here */
    CHECK_STATUS(gm_open_shared(taker, getpid(), &closed, 1, &mapped), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("pidfd_getfd");
    gm_shared_piece plain = view.pieces[0];
    plain.descriptor = open("/dev/null", O_RDONLY | O_CLOEXEC); /* not memory of that size */
    CHECK_STATUS(gm_open_shared(taker, getpid(), &plain, 1, &mapped), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("holds no");
    close(plain.descriptor);
    CHECK_STATUS(gm_open_shared(taker, 0, view.pieces, view.count, &mapped), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_open_shared(taker, getpid(), view.pieces, 0, &mapped), GM_ERROR_INVALID_ARGUMENT);
    /* One left open: gm_destroy unmaps it. A pointer it is not, looked up among the open ones, is refused. */
    CHECK_OK(gm_open_shared(taker, getpid(), view.pieces, view.count, &mapped));
    CHECK_STATUS(gm_close_shared(taker, small), GM_ERROR_INVALID_POINTER); /* not a shared mapping */
    CHECK_MESSAGE("not mapped by gm_open_shared");
    gm_destroy(taker, NULL);

    CHECK_OK(gm_free(sharer, block));
    CHECK_OK(gm_free(sharer, small));
    CHECK_OK(gm_validate(sharer));
    gm_destroy(sharer, NULL);
}

/* The sim has no memory to give another process, and plain segments have no chunks to give. */
static void sim_and_segments_cannot_share(void)
{
    const char *configs[] = {"backend:sim", "backend:host,capacity:1GiB,engine:segments"};
    for (int i = 0; i < 2; i++) {
        gm_allocator *allocator = new_allocator(configs[i]);
        void *block = NULL;
        REQUIRE(gm_malloc(allocator, MIB, 0, &block) == GM_OK);
        uint64_t offset = 0;
        size_t count = 0;
        gm_shared_piece piece;
        CHECK_STATUS(gm_share(allocator, block, &offset, &piece, 1, &count), GM_ERROR_NOT_SUPPORTED);
        CHECK_MESSAGE(i == 0 ? "sim backend cannot share" : "segments engine");
        CHECK_OK(gm_free(allocator, block));
        gm_destroy(allocator, NULL);
    }
    gm_allocator *sim = new_allocator("backend:sim");
    gm_shared_piece piece = {0, 2 * MIB, 3};
    void *mapped = NULL;
    CHECK_STATUS(gm_open_shared(sim, getpid(), &piece, 1, &mapped), GM_ERROR_NOT_SUPPORTED);
    gm_destroy(sim, NULL);
}

RUN_TESTS(TEST_CASE(a_block_reads_and_writes_the_same_through_both_mappings),
          TEST_CASE(a_chunk_is_exported_once_and_closed_with_it), TEST_CASE(a_child_process_maps_the_parents_block),
          TEST_CASE(bad_shares_are_refused), TEST_CASE(sim_and_segments_cannot_share))
