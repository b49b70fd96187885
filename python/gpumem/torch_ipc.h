// torch_ipc.h -- the handle by which torch.multiprocessing sends a CUDA tensor to another process (CUDA
// IPC): what the torch adapter's shareIpcHandle writes and its getIpcDevPtr reads.
//
// PyTorch's own allocator writes a version byte (2), then 'c' and a cudaIpcMemHandle_t (memory of
// cudaMalloc), or 'e' and the pages of an expandable segment: a header {pid_t pid; size_t
// segment_size; size_t num_handles}, zero padded, and one file descriptor (an int) of that process per
// page, all pages segment_size bytes and back to back. gpumem's memory is chunks (gm_share). When every
// chunk under an allocation has the same size -- a tensor inside one chunk, the common case -- gpumem
// writes the 'e' form, so a process on PyTorch's allocator can map it; otherwise its own form, marked
// 'g': the sharing process's id, then each chunk as its offset in the shared range, its size and its
// descriptor, which only a process using gpumem reads. gpumem reads 'g' and the descriptor form of 'e'
// itself (gm_open_shared maps the chunks back to back); any other handle ('c', or 'e' with fabric
// handles) goes to the allocator gpumem replaced, which is PyTorch's and knows its own handles. A
// receiver maps a handle once while any tensor of it lives, as native caches its opened handles.
#pragma once

#include <c10/util/Exception.h>

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpumem.h"

namespace gpumem_ipc {

constexpr char kMark = 'g';
constexpr char kNativeVersion = 2;
constexpr char kNativeSegment = 'e';

struct Share {
  int32_t process = 0;
  std::vector<gm_shared_piece> pieces;
};

// PyTorch's header of an expandable segment's pages, as it writes it.
struct NativeHeader {
  pid_t pid;
  size_t segment_size;
  size_t num_handles;
};

template <typename T> void put(std::string &out, T value) {
  out.append(reinterpret_cast<const char *>(&value), sizeof value);
}

template <typename T> bool take(const std::string &in, size_t &at, T *value) {
  if (in.size() - at < sizeof *value)
    return false;
  std::memcpy(value, in.data() + at, sizeof *value);
  at += sizeof *value;
  return true;
}

// Pieces that PyTorch's 'e' form can carry: all the same size, back to back from 0.
inline bool equal_pages(const std::vector<gm_shared_piece> &pieces) {
  for (size_t i = 0; i < pieces.size(); i++)
    if (pieces[i].size != pieces[0].size || pieces[i].offset != i * pieces[0].size)
      return false;
  return !pieces.empty();
}

inline std::string encode(int32_t process, const std::vector<gm_shared_piece> &pieces) {
  if (equal_pages(pieces)) {
    std::string out{kNativeVersion, kNativeSegment};
    NativeHeader header;
    std::memset(&header, 0, sizeof header); // the padding too: equal handles are equal strings
    header.pid = process;
    header.segment_size = pieces[0].size;
    header.num_handles = pieces.size();
    put(out, header);
    for (const gm_shared_piece &piece : pieces)
      put(out, static_cast<int>(piece.descriptor));
    return out;
  }
  std::string out(1, kMark);
  put(out, process);
  put(out, static_cast<uint32_t>(pieces.size()));
  for (const gm_shared_piece &piece : pieces) {
    put(out, piece.offset);
    put(out, piece.size);
    put(out, static_cast<int32_t>(piece.descriptor));
  }
  return out;
}

// PyTorch's 'e' form with file descriptors (not fabric handles: those are 64 bytes each).
inline bool decode_native_segment(const std::string &in, Share *share) {
  size_t at = 2;
  NativeHeader header;
  if (in.size() < 2 || in[0] != kNativeVersion || in[1] != kNativeSegment || !take(in, at, &header) ||
      header.segment_size == 0 || header.num_handles == 0 || header.num_handles > (in.size() - at) / sizeof(int) ||
      in.size() - at != header.num_handles * sizeof(int))
    return false;
  share->process = header.pid;
  share->pieces.resize(header.num_handles);
  for (size_t i = 0; i < header.num_handles; i++) {
    int descriptor = -1;
    take(in, at, &descriptor);
    share->pieces[i] = {i * header.segment_size, header.segment_size, descriptor};
  }
  return true;
}

// False for a handle that gpumem does not map itself, or one cut short.
inline bool decode(const std::string &in, Share *share) {
  if (decode_native_segment(in, share))
    return true;
  size_t at = 1;
  uint32_t count = 0;
  if (in.empty() || in[0] != kMark || !take(in, at, &share->process) || !take(in, at, &count) ||
      count > (in.size() - at) / 20)
    return false;
  share->pieces.resize(count);
  for (gm_shared_piece &piece : share->pieces) {
    int32_t descriptor = -1;
    if (!take(in, at, &piece.offset) || !take(in, at, &piece.size) || !take(in, at, &descriptor))
      return false;
    piece.descriptor = descriptor;
  }
  return at == in.size();
}

// The handle of the live allocation at `pointer` of `allocator`, and its offset into what is shared.
inline std::string share(gm_allocator *allocator, void *pointer, uint64_t *offset) {
  std::vector<gm_shared_piece> pieces(4);
  size_t count = 0;
  gm_status status;
  while ((status = gm_share(allocator, pointer, offset, pieces.data(), pieces.size(), &count)) ==
         GM_ERROR_BUFFER_TOO_SMALL)
    pieces.resize(count);
  TORCH_CHECK(status == GM_OK, "gpumem: cannot share this CUDA tensor with another process: ", gm_last_error());
  pieces.resize(count);
  return encode(static_cast<int32_t>(getpid()), pieces);
}

// The handles this process opened, each mapped once while any tensor of it lives.
class OpenedHandles {
 public:
  // The memory of `handle`: mapped by gpumem in the allocator `receiver()` gives, or, for a handle that
  // gpumem does not map itself, opened by `open_other`.
  template <typename Receiver, typename OpenOther>
  std::shared_ptr<void> open(const std::string &handle, Receiver receiver, OpenOther open_other) {
    std::lock_guard<std::mutex> guard(mutex_);
    auto found = opened_.find(handle);
    if (found != opened_.end())
      if (std::shared_ptr<void> alive = found->second.lock())
        return alive;
    Share share;
    if (!decode(handle, &share))
      return open_other(handle);
    gm_allocator *allocator = receiver();
    void *pointer = nullptr;
    TORCH_CHECK(gm_open_shared(allocator, share.process, share.pieces.data(), share.pieces.size(), &pointer) == GM_OK,
                "gpumem: cannot map the CUDA tensor process ", share.process, " shared: ", gm_last_error());
    std::shared_ptr<void> mapped(pointer, [this, allocator, handle](void *start) {
      gm_close_shared(allocator, start);
      std::lock_guard<std::mutex> erase_guard(mutex_);
      auto entry = opened_.find(handle);
      if (entry != opened_.end() && entry->second.expired())
        opened_.erase(entry);
    });
    opened_[handle] = mapped;
    return mapped;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::weak_ptr<void>> opened_; // handle -> memory another process shared
};

} // namespace gpumem_ipc
