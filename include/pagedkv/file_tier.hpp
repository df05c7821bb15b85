// file_tier: a prefix_store (prefix_store.hpp) that keeps each block in a file of a directory,
// named by the block's chained hash in hex (`<hash>.blk`). The example third level of the prefix
// cache, below a host_prefix_tier.
//
// A file is a 56-byte header and the block's payload (the KV bytes of one host block):
//
//   offset  size  field (little-endian)
//        0     8  magic "PKVBLK\0\1"
//        8     4  format version (1)
//       12     4  zero
//       16     8  block hash (the key; also the file's name)
//       24    16  prefix digest (low, high: prefix_store.hpp)
//       40     8  payload byte count
//       48     8  XXH3-64 checksum of the payload
//
// A load checks every field against what it asked for, the file's size against the header, and
// the payload against its checksum; a file that fails any check is a miss, counted and deleted,
// never K/V handed back. Writes go to `<hash>.tmp` and are renamed over `<hash>.blk`, so a reader
// never sees half a file under the block's name; a crash that leaves a short file behind the
// rename (no fsync) is caught by the same checks. Loads complete inside load(): poll() hands the
// completions over. At most `max_blocks` files are kept, least recently stored or loaded deleted
// first; the index is in memory, rebuilt from the headers when a tier opens a directory. One
// file_tier owns a directory at a time.
#pragma once

#include <pagedkv/error.hpp>
#include <pagedkv/prefix_store.hpp>
#include <pagedkv/types.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pagedkv {

struct file_tier_options {
  std::filesystem::path directory{};  ///< created if missing
  std::int64_t max_blocks = 1024;     ///< files kept, >= 1
  std::size_t block_bytes = 0;        ///< payload bytes of a block (one host block), >= 1
};

/// Counters since construction.
struct file_tier_stats {
  std::int64_t stored_blocks = 0;   ///< files written
  std::int64_t loaded_blocks = 0;   ///< loads that completed with the block's bytes
  std::int64_t missed_loads = 0;    ///< loads of a block no file holds (deleted behind the index)
  std::int64_t damaged_blocks = 0;  ///< files truncated, corrupted or of another key: misses
  std::int64_t evicted_blocks = 0;  ///< files deleted for capacity
  std::int64_t failed_writes = 0;   ///< stores the file system refused (full disk): dropped
};

class file_tier {
 public:
  static constexpr std::size_t header_bytes = 56;
  static constexpr std::uint32_t format_version = 1;
  static constexpr std::array<unsigned char, 8> magic{'P', 'K', 'V', 'B', 'L', 'K', 0, 1};

  /// Opens (or creates) the directory and indexes the block files in it; leftover temporary files
  /// and files whose header is damaged are deleted.
  /// Errors: invalid_argument for a capacity or block size below 1, or a directory that cannot be
  /// created or read.
  explicit file_tier(file_tier_options options) : options_(std::move(options)) {
    if (options_.max_blocks < 1 || options_.block_bytes < 1) {
      detail::fail(errc::invalid_argument, "file_tier needs max_blocks and block_bytes >= 1, got ",
                   options_.max_blocks, " and ", options_.block_bytes);
    }
    std::error_code ec;
    std::filesystem::create_directories(options_.directory, ec);
    if (ec || !std::filesystem::is_directory(options_.directory)) {
      detail::fail(errc::invalid_argument, "file_tier directory ", options_.directory.string(),
                   " cannot be created: ", ec.message());
    }
    std::vector<std::filesystem::path> damaged;
    for (const auto& entry : std::filesystem::directory_iterator(options_.directory, ec)) {
      const std::filesystem::path& path = entry.path();
      if (path.extension() == ".tmp") {
        damaged.push_back(path);
        continue;
      }
      const std::optional<block_hash> hash = parse_name(path);
      if (!hash) continue;  // not ours
      std::ifstream in(path, std::ios::binary);
      std::array<unsigned char, header_bytes> raw{};
      in.read(reinterpret_cast<char*>(raw.data()), header_bytes);
      const std::optional<header> h = in.gcount() == header_bytes ? parse(raw) : std::nullopt;
      if (!h || h->hash != *hash || h->payload_bytes != options_.block_bytes) {
        damaged.push_back(path);
        ++stats_.damaged_blocks;
        continue;
      }
      remember(*hash, h->digest);
    }
    if (ec) detail::fail(errc::invalid_argument, "file_tier directory ", options_.directory.string(), ": ", ec.message());
    for (const auto& path : damaged) std::filesystem::remove(path, ec);
    while (static_cast<std::int64_t>(index_.size()) > options_.max_blocks) evict_oldest();
  }

  [[nodiscard]] const file_tier_options& options() const noexcept { return options_; }
  [[nodiscard]] const file_tier_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] std::int64_t num_blocks() const noexcept { return static_cast<std::int64_t>(index_.size()); }
  /// The file of the block with hash `hash`, whether or not it exists.
  [[nodiscard]] std::filesystem::path path_of(block_hash hash) const { return options_.directory / name(hash, ".blk"); }

  /// How many leading blocks of `chain` the index holds under their keys (hash and digest). Reads
  /// no file: a file damaged since it was written is found by load().
  std::int32_t lookup(std::span<const store_key> chain) const {
    std::int32_t n = 0;
    for (const store_key& key : chain) {
      const auto it = index_.find(key.hash);
      if (it == index_.end() || it->second.digest != key.digest) break;
      ++n;
    }
    return n;
  }

  /// Writes the block's file (temporary file, then rename), unless the index holds this key
  /// already; evicts the least recently used file beyond max_blocks. A write the file system
  /// refuses stores nothing (stats().failed_writes).
  /// Errors: invalid_argument if payload is not block_bytes long (nothing written).
  void store(const store_key& key, std::span<const std::byte> payload) {
    if (payload.size() != options_.block_bytes) {
      detail::fail(errc::invalid_argument, "file_tier store of ", payload.size(), " bytes: blocks are ",
                   options_.block_bytes);
    }
    if (const auto it = index_.find(key.hash); it != index_.end() && it->second.digest == key.digest) {
      touch(it->second);
      return;
    }
    const std::array<unsigned char, header_bytes> raw = serialize(
        {key.hash, key.digest, payload.size(), XXH3_64bits(payload.data(), payload.size())});
    const std::filesystem::path temporary = options_.directory / name(key.hash, ".tmp");
    std::error_code ec;
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(raw.data()), header_bytes);
      out.write(reinterpret_cast<const char*>(payload.data()), static_cast<std::streamsize>(payload.size()));
      out.close();
      if (!out) {
        std::filesystem::remove(temporary, ec);
        ++stats_.failed_writes;
        return;
      }
    }
    std::filesystem::rename(temporary, path_of(key.hash), ec);
    if (ec) {
      std::filesystem::remove(temporary, ec);
      ++stats_.failed_writes;
      return;
    }
    forget(key.hash);  // a colliding hash's file was just replaced
    remember(key.hash, key.digest);
    ++stats_.stored_blocks;
    while (static_cast<std::int64_t>(index_.size()) > options_.max_blocks) evict_oldest();
  }

  /// Reads the block stored under `key` into `into` (block_bytes long) and verifies it; the
  /// completion, ok or not, is queued for poll(). A failed load leaves `into` undefined and deletes
  /// the file.
  store_ticket load(const store_key& key, std::span<std::byte> into) {
    const store_ticket ticket = ++next_ticket_;
    const bool ok = read(key, into);
    if (ok) {
      ++stats_.loaded_blocks;
      touch(index_.at(key.hash));
    }
    done_.push_back({ticket, ok});
    return ticket;
  }

  void poll(std::vector<store_completion>& done) {
    done.insert(done.end(), done_.begin(), done_.end());
    done_.clear();
  }

  /// Deletes every block file (after a weight update: the stored KV is the old model's).
  void clear() {
    std::error_code ec;
    for (const block_hash hash : ages_) std::filesystem::remove(path_of(hash), ec);
    index_.clear();
    ages_.clear();
  }

 private:
  struct header {
    block_hash hash = 0;
    prefix_digest digest{};
    std::uint64_t payload_bytes = 0;
    std::uint64_t checksum = 0;
  };
  struct indexed {
    prefix_digest digest{};
    std::list<block_hash>::iterator age;
  };
  static_assert(std::endian::native == std::endian::little, "file_tier writes its header in host byte order");

  static std::array<unsigned char, header_bytes> serialize(const header& h) {
    std::array<unsigned char, header_bytes> raw{};
    std::memcpy(raw.data(), magic.data(), magic.size());
    std::memcpy(raw.data() + 8, &format_version, 4);
    std::memcpy(raw.data() + 16, &h.hash, 8);
    std::memcpy(raw.data() + 24, &h.digest.low, 8);
    std::memcpy(raw.data() + 32, &h.digest.high, 8);
    std::memcpy(raw.data() + 40, &h.payload_bytes, 8);
    std::memcpy(raw.data() + 48, &h.checksum, 8);
    return raw;
  }
  static std::optional<header> parse(const std::array<unsigned char, header_bytes>& raw) {
    std::uint32_t version = 0;
    std::uint32_t zero = 0;
    std::memcpy(&version, raw.data() + 8, 4);
    std::memcpy(&zero, raw.data() + 12, 4);
    if (std::memcmp(raw.data(), magic.data(), magic.size()) != 0 || version != format_version || zero != 0) {
      return std::nullopt;
    }
    header h;
    std::memcpy(&h.hash, raw.data() + 16, 8);
    std::memcpy(&h.digest.low, raw.data() + 24, 8);
    std::memcpy(&h.digest.high, raw.data() + 32, 8);
    std::memcpy(&h.payload_bytes, raw.data() + 40, 8);
    std::memcpy(&h.checksum, raw.data() + 48, 8);
    return h;
  }
  static std::string name(block_hash hash, const char* extension) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s(16, '0');
    for (int i = 15; i >= 0; --i, hash >>= 4) s[static_cast<std::size_t>(i)] = digits[hash & 15];
    return s + extension;
  }
  static std::optional<block_hash> parse_name(const std::filesystem::path& path) {
    const std::string stem = path.stem().string();
    if (path.extension() != ".blk" || stem.size() != 16) return std::nullopt;
    block_hash hash = 0;
    for (char c : stem) {
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (digit < 0) return std::nullopt;
      hash = hash << 4 | static_cast<block_hash>(digit);
    }
    return hash;
  }

  /// Whether `into` now holds the payload stored under `key`; deletes a file that fails a check.
  bool read(const store_key& key, std::span<std::byte> into) {
    const auto it = index_.find(key.hash);
    if (it == index_.end() || it->second.digest != key.digest) {
      ++stats_.missed_loads;  // none, or another prefix's block under a colliding hash
      return false;
    }
    const std::filesystem::path path = path_of(key.hash);
    std::error_code ec;
    const std::uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec) {
      forget(key.hash);
      ++stats_.missed_loads;
      return false;
    }
    std::ifstream in(path, std::ios::binary);
    std::array<unsigned char, header_bytes> raw{};
    in.read(reinterpret_cast<char*>(raw.data()), header_bytes);
    const std::optional<header> h = in.gcount() == header_bytes ? parse(raw) : std::nullopt;
    const bool intact = h && h->hash == key.hash && h->digest == key.digest && h->payload_bytes == into.size() &&
                        size == header_bytes + into.size() &&
                        in.read(reinterpret_cast<char*>(into.data()), static_cast<std::streamsize>(into.size())) &&
                        XXH3_64bits(into.data(), into.size()) == h->checksum;
    if (intact) return true;
    ++stats_.damaged_blocks;
    in.close();
    forget(key.hash);
    std::filesystem::remove(path, ec);
    return false;
  }

  void remember(block_hash hash, const prefix_digest& digest) {
    ages_.push_back(hash);
    index_[hash] = {digest, std::prev(ages_.end())};
  }
  void touch(indexed& entry) { ages_.splice(ages_.end(), ages_, entry.age); }
  void forget(block_hash hash) {
    const auto it = index_.find(hash);
    if (it == index_.end()) return;
    ages_.erase(it->second.age);
    index_.erase(it);
  }
  void evict_oldest() {
    const block_hash hash = ages_.front();
    forget(hash);
    std::error_code ec;
    std::filesystem::remove(path_of(hash), ec);
    ++stats_.evicted_blocks;
  }

  file_tier_options options_;
  std::unordered_map<block_hash, indexed> index_;
  std::list<block_hash> ages_;  // least recently stored or loaded first
  std::vector<store_completion> done_;
  store_ticket next_ticket_ = 0;
  file_tier_stats stats_{};
};

static_assert(prefix_store<file_tier>);

}  // namespace pagedkv
