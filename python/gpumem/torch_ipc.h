// torch_ipc.h -- the handle by which torch.multiprocessing sends a CUDA tensor of gpumem's to another
// process (CUDA IPC): what the torch adapter's shareIpcHandle writes and its getIpcDevPtr reads.
//
// Native writes a cudaIpcMemHandle ('c') or, for expandable segments, file descriptors of equal-sized
// pages ('e'). gpumem's memory is chunks of different sizes, so its handle is its own, marked 'g':
// the sharing process's id, then each chunk under the allocation (gm_share) as its offset in the shared
// range, its size and its file descriptor in that process. The receiver takes the descriptors with
// pidfd_getfd and maps the chunks back to back (gm_open_shared). Both processes must use gpumem.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpumem.h"

namespace gpumem_ipc {

constexpr char kMark = 'g';

struct Share {
  int32_t process = 0;
  std::vector<gm_shared_piece> pieces;
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

inline std::string encode(int32_t process, const std::vector<gm_shared_piece> &pieces) {
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

// False for a handle that is not gpumem's or is cut short.
inline bool decode(const std::string &in, Share *share) {
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

} // namespace gpumem_ipc
