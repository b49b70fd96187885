/*
 * sim.c -- the simulated device.
 *
 * Nothing is touched: addresses are fake, handed out by a bump pointer from 0x200000000000, so no two
 * live ranges ever overlap. Addresses given back are kept, as a driver keeps them, in a sorted list of
 * free ranges, each merged with its free neighbours: the list holds at most one range per gap below a
 * live range (and one below the fresh addresses), however many ranges come and go. Fresh addresses are
 * handed out first (so a stale pointer points nowhere), the list's once they run out. The device model
 * (device_model.c) keeps the books, enforces the capacity and the rules of mapping, simulates streams
 * and events, and charges each call the cost it has on an H200. Default capacity is an H200's 143771 MiB.
 */
#include "backend/backend.h"
#include "backend/device_model.h"

#include "base/array.h"
#include "base/error.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define SIM_ADDRESS_BASE 0x200000000000ull
#define SIM_ADDRESS_LIMIT 0x7f0000000000ull
#define SIM_DEFAULT_CAPACITY (143771ull << 20)

typedef struct address_range {
    uintptr_t base;
    uint64_t size;
} address_range;

typedef struct sim_state {
    gm_device_model *model;
    uintptr_t next_address;
    uint64_t page_size;
    address_range *returned; /* ranges given back, by address, none touching another */
    size_t returned_count;
    size_t returned_capacity;
} sim_state;

static sim_state *state_of(gm_backend *backend)
{
    return (sim_state *)backend->state;
}

static gm_status sim_open(gm_backend *backend, const gm_backend_config *config)
{
    sim_state *state = gm_system_calloc(1, sizeof *state);
    if (!state)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the sim backend");
    state->page_size = config->page_size;
    state->next_address = SIM_ADDRESS_BASE;
    return gm_model_backend_open(backend, state, config, SIM_DEFAULT_CAPACITY, config->cost_model);
}

static uint64_t whole_pages(const sim_state *state, uint64_t size)
{
    return (size + state->page_size - 1) / state->page_size * state->page_size;
}

static void remove_returned(sim_state *state, size_t index)
{
    memmove(&state->returned[index], &state->returned[index + 1],
            (state->returned_count - index - 1) * sizeof *state->returned);
    state->returned_count--;
}

/* Fake addresses, page-aligned: fresh ones while there are (a stale pointer then points nowhere), then,
 * as a driver does, ranges given back before (the first that fits). */
static gm_status take_addresses(sim_state *state, uint64_t size, uintptr_t *address_out)
{
    uint64_t rounded = whole_pages(state, size);
    if (rounded < size)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "sim: fake address space exhausted");
    if (rounded <= SIM_ADDRESS_LIMIT - state->next_address) {
        *address_out = state->next_address;
        state->next_address += rounded;
        return GM_OK;
    }
    for (size_t i = 0; i < state->returned_count; i++) {
        address_range *range = &state->returned[i];
        if (range->size < rounded)
            continue;
        *address_out = range->base;
        range->base += rounded;
        range->size -= rounded;
        if (!range->size)
            remove_returned(state, i);
        return GM_OK;
    }
    return gm_fail(GM_ERROR_OUT_OF_MEMORY, "sim: fake address space exhausted");
}

/* Where a range starting at `base` goes in the sorted list: the index of the first range above it. */
static size_t returned_position(const sim_state *state, uintptr_t base)
{
    size_t low = 0, high = state->returned_count;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (state->returned[middle].base < base)
            low = middle + 1;
        else
            high = middle;
    }
    return low;
}

static bool insert_returned(sim_state *state, size_t index, address_range range)
{
    address_range *grown = gm_array_room_for_one(state->returned, state->returned_count, &state->returned_capacity,
                                                 sizeof *grown, 16);
    if (!grown)
        return false;
    state->returned = grown;
    memmove(&state->returned[index + 1], &state->returned[index],
            (state->returned_count - index) * sizeof *state->returned);
    state->returned[index] = range;
    state->returned_count++;
    return true;
}

/* Keep a range given back for reuse, merged with the free ranges beside it. Without host memory for the
 * list, the range is simply not reused. */
static void return_addresses(sim_state *state, uintptr_t base, uint64_t size)
{
    address_range range = {base, whole_pages(state, size)};
    size_t index = returned_position(state, base);
    address_range *before = index > 0 ? &state->returned[index - 1] : NULL;
    address_range *after = index < state->returned_count ? &state->returned[index] : NULL;
    if (before && before->base + before->size == range.base) {
        before->size += range.size;
        if (after && before->base + before->size == after->base) {
            before->size += after->size;
            remove_returned(state, index);
        }
    } else if (after && range.base + range.size == after->base) {
        after->base = range.base;
        after->size += range.size;
    } else {
        insert_returned(state, index, range);
    }
}

size_t gm_sim_returned_range_count(gm_backend *backend)
{
    return backend->operations == &gm_sim_backend_operations ? state_of(backend)->returned_count : 0;
}

static void sim_close(gm_backend *backend)
{
    if (backend->state)
        free(state_of(backend)->returned);
    gm_model_close(backend);
}

static gm_status sim_segment_allocate(gm_backend *backend, uint64_t size, uintptr_t *address_out)
{
    sim_state *state = state_of(backend);
    uintptr_t address = 0;
    gm_status status = gm_device_model_check_room(state->model, size);
    if (status == GM_OK)
        status = take_addresses(state, size, &address);
    if (status == GM_OK)
        status = gm_device_model_segment_allocate(state->model, address, size);
    if (status == GM_OK)
        *address_out = address;
    return status;
}

static gm_status sim_segment_free(gm_backend *backend, uintptr_t address, uint64_t size)
{
    gm_status status = gm_device_model_segment_free(state_of(backend)->model, address, size);
    if (status == GM_OK)
        return_addresses(state_of(backend), address, size);
    return status;
}

static gm_status sim_address_reserve(gm_backend *backend, uint64_t size, uintptr_t *address_out)
{
    sim_state *state = state_of(backend);
    uintptr_t address = 0;
    gm_status status = take_addresses(state, size, &address);
    if (status == GM_OK)
        status = gm_device_model_address_reserve(state->model, address, size);
    if (status == GM_OK)
        *address_out = address;
    return status;
}

static gm_status sim_address_free(gm_backend *backend, uintptr_t address, uint64_t size)
{
    gm_status status = gm_device_model_address_free(state_of(backend)->model, address, size);
    if (status == GM_OK)
        return_addresses(state_of(backend), address, size);
    return status;
}

static gm_status sim_physical_create(gm_backend *backend, uint64_t size, uint64_t *handle_out)
{
    static _Atomic uint64_t next_handle = 1;
    uint64_t handle = next_handle++;
    gm_status status = gm_device_model_physical_create(state_of(backend)->model, handle, size);
    if (status == GM_OK)
        *handle_out = handle;
    return status;
}

static gm_status sim_physical_release(gm_backend *backend, uint64_t handle)
{
    return gm_device_model_physical_release(state_of(backend)->model, handle);
}

/* No data to copy: only the rules and the wait. */
static gm_status sim_copy_into(gm_backend *backend, uint64_t handle, uint64_t size, uintptr_t source)
{
    return gm_device_model_copy_into(state_of(backend)->model, handle, size, source);
}

static gm_status sim_map(gm_backend *backend, uintptr_t address, uint64_t size, uint64_t handle)
{
    return gm_device_model_map(state_of(backend)->model, address, size, handle);
}

static gm_status sim_set_access(gm_backend *backend, uintptr_t address, uint64_t size)
{
    return gm_device_model_set_access(state_of(backend)->model, address, size);
}

static gm_status sim_grant_access(gm_backend *backend, uintptr_t address, uint64_t size, int device)
{
    (void)device;
    return gm_device_model_set_access(state_of(backend)->model, address, size);
}

static gm_status sim_unmap(gm_backend *backend, uintptr_t address, uint64_t size)
{
    return gm_device_model_unmap(state_of(backend)->model, address, size);
}

const gm_backend_operations gm_sim_backend_operations = {
    .name = "sim",
    .open = sim_open,
    .close = sim_close,
    .memory_info = gm_model_memory_info,
    .segment_allocate = sim_segment_allocate,
    .segment_free = sim_segment_free,
    .address_reserve = sim_address_reserve,
    .address_free = sim_address_free,
    .physical_create = sim_physical_create,
    .physical_release = sim_physical_release,
    .map = sim_map,
    .copy_into = sim_copy_into,
    .set_access = sim_set_access,
    .grant_access = sim_grant_access,
    .unmap = sim_unmap,
    GM_MODEL_OPERATIONS,
};
