#include "store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "libcomm/detail/log.h"
#include "libcomm/error.h"

namespace comm {
namespace {

using Clock = std::chrono::steady_clock;

// A record: kind (1 byte), key length and value length (4 bytes each, little
// endian), then the key and the value.
constexpr std::size_t kRecordHeader = 9;

void put_u32(std::uint8_t* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

std::uint32_t get_u32(const std::uint8_t* in) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(in[i]) << (8 * i);
  return v;
}

}  // namespace

// Holds flock on the store's file for one scope: shared to read, exclusive
// to write.
class FileStore::FileLock {
 public:
  FileLock(int fd, const std::string& path, bool exclusive) : fd_(fd) {
    while (flock(fd_, exclusive ? LOCK_EX : LOCK_SH) != 0) {
      if (errno != EINTR) throw SystemError(errno, "FileStore: flock " + path);
    }
  }
  ~FileLock() { flock(fd_, LOCK_UN); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

FileStore::FileStore(std::string path, Duration timeout)
    : Store(timeout), path_(std::move(path)) {
  open_locked_file();
  // open_locked_file returns holding an exclusive lock through fd_ ...
  try {
    catch_up();
    write_record(RecordKind::kUsers, "", encode_counter(1));
  } catch (...) {
    flock(fd_, LOCK_UN);
    close(fd_);
    throw;
  }
  flock(fd_, LOCK_UN);  // ... which is released here.
}

void FileStore::open_locked_file() {
  // Bounded: each retry means another process removed the file between our
  // open and our lock, which happens at most once per round of users.
  for (int attempt = 0; attempt < 100; ++attempt) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw SystemError(errno, "FileStore: open " + path_);
    while (flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        const int error = errno;
        close(fd_);
        throw SystemError(error, "FileStore: flock " + path_);
      }
    }
    struct stat opened {
    }, named{};
    if (fstat(fd_, &opened) == 0 && stat(path_.c_str(), &named) == 0 &&
        opened.st_ino == named.st_ino && opened.st_dev == named.st_dev) {
      return;
    }
    flock(fd_, LOCK_UN);
    close(fd_);
  }
  throw BackendError("FileStore: " + path_ +
                     " kept being removed while opening it; is another job "
                     "using the same path?");
}

FileStore::~FileStore() {
  try {
    std::lock_guard<std::mutex> guard(mutex_);
    FileLock lock(fd_, path_, true);
    catch_up();
    write_record(RecordKind::kUsers, "", encode_counter(-1));
    if (users_ <= 0) ::unlink(path_.c_str());
  } catch (const std::exception& e) {
    COMM_LOG_WARN("FileStore {}: could not sign off cleanly: {}", path_,
                  e.what());
  }
  close(fd_);
}

void FileStore::catch_up() {
  struct stat st {};
  if (fstat(fd_, &st) != 0)
    throw SystemError(errno, "FileStore: fstat " + path_);
  const std::int64_t size = st.st_size;
  if (size <= read_offset_) return;
  Bytes data(static_cast<std::size_t>(size - read_offset_));
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = pread(fd_, data.data() + done, data.size() - done,
                            read_offset_ + static_cast<std::int64_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw SystemError(errno, "FileStore: read " + path_);
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  std::size_t pos = 0;
  while (pos + kRecordHeader <= done) {
    const auto kind = static_cast<RecordKind>(data[pos]);
    const std::uint32_t key_size = get_u32(&data[pos + 1]);
    const std::uint32_t value_size = get_u32(&data[pos + 5]);
    const std::size_t end = pos + kRecordHeader + key_size + value_size;
    if (kind < RecordKind::kSet || kind > RecordKind::kUsers ||
        key_size > kMaxKeySize || value_size > kMaxValueSize || end > done) {
      throw BackendError("FileStore: " + path_ + " is corrupt at offset " +
                         std::to_string(read_offset_ + pos) +
                         " (a writer may have died while appending); remove "
                         "it and restart the job");
    }
    const auto* key = reinterpret_cast<const char*>(&data[pos + kRecordHeader]);
    const auto* value = &data[pos + kRecordHeader + key_size];
    apply(kind, std::string(key, key_size), Bytes(value, value + value_size));
    pos = end;
  }
  if (pos != done) {
    throw BackendError("FileStore: " + path_ + " ends in a truncated record");
  }
  read_offset_ += static_cast<std::int64_t>(pos);
}

void FileStore::apply(RecordKind kind, const std::string& key, Bytes value) {
  switch (kind) {
    case RecordKind::kSet: table_.set(key, std::move(value)); break;
    case RecordKind::kAppend: table_.append(key, value); break;
    case RecordKind::kDelete: table_.erase(key); break;
    case RecordKind::kUsers: users_ += decode_counter("(users)", value); break;
  }
}

void FileStore::write_record(RecordKind kind, const std::string& key,
                             const Bytes& value) {
  Bytes record(kRecordHeader + key.size() + value.size());
  record[0] = static_cast<std::uint8_t>(kind);
  put_u32(&record[1], static_cast<std::uint32_t>(key.size()));
  put_u32(&record[5], static_cast<std::uint32_t>(value.size()));
  std::memcpy(&record[kRecordHeader], key.data(), key.size());
  if (!value.empty()) {
    std::memcpy(&record[kRecordHeader + key.size()], value.data(),
                value.size());
  }
  // The table has caught up to the end of the file under the exclusive
  // lock, so the record goes exactly there.
  std::size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = pwrite(fd_, record.data() + done, record.size() - done,
                             read_offset_ + static_cast<std::int64_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw SystemError(errno, "FileStore: write " + path_);
    done += static_cast<std::size_t>(n);
  }
  read_offset_ += static_cast<std::int64_t>(record.size());
  apply(kind, key, value);
}

void FileStore::wait_for(const std::vector<std::string>& keys,
                         Duration timeout) {
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  auto backoff = std::chrono::milliseconds(1);
  while (true) {
    std::vector<std::string> missing;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      FileLock lock(fd_, path_, false);
      catch_up();
      missing = table_.missing(keys);
    }
    if (missing.empty()) return;
    const auto now = Clock::now();
    if (now >= deadline)
      throw_store_timeout("FileStore " + path_, missing, timeout);
    std::this_thread::sleep_for(
        std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(50));
  }
}

void FileStore::do_set(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(fd_, path_, true);
  catch_up();
  write_record(RecordKind::kSet, key, value);
}

Bytes FileStore::do_get(const std::string& key, Duration timeout) {
  return do_multi_get({key}, timeout).front();
}

std::int64_t FileStore::do_add(const std::string& key, std::int64_t delta) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(fd_, path_, true);
  catch_up();
  const std::int64_t sum = table_.sum_after_add(key, delta);
  write_record(RecordKind::kSet, key, encode_counter(sum));
  return sum;
}

Bytes FileStore::do_compare_set(const std::string& key, const Bytes& expected,
                                const Bytes& desired) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(fd_, path_, true);
  catch_up();
  if (table_.compare_matches(key, expected)) {
    write_record(RecordKind::kSet, key, desired);
    return desired;
  }
  const Bytes* current = table_.find(key);
  return current == nullptr ? expected : *current;
}

void FileStore::do_wait(const std::vector<std::string>& keys,
                        Duration timeout) {
  wait_for(keys, timeout);
}

bool FileStore::do_check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(fd_, path_, false);
  catch_up();
  return table_.contains_all(keys);
}

bool FileStore::do_delete_key(const std::string& key) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(fd_, path_, true);
  catch_up();
  if (table_.find(key) == nullptr) return false;
  write_record(RecordKind::kDelete, key, {});
  return true;
}

std::int64_t FileStore::do_num_keys() {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(fd_, path_, false);
  catch_up();
  return table_.size();
}

std::vector<Bytes> FileStore::do_multi_get(const std::vector<std::string>& keys,
                                           Duration timeout) {
  wait_for(keys, timeout);
  std::lock_guard<std::mutex> guard(mutex_);
  // Another thread of this process may have replayed a delete of one of
  // the keys since wait_for saw them all.
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) {
    const Bytes* value = table_.find(key);
    if (value == nullptr) {
      throw InvalidArgument("FileStore " + path_ + ": key '" + key +
                            "' was deleted while being read");
    }
    values.push_back(*value);
  }
  return values;
}

void FileStore::do_multi_set(const std::vector<std::string>& keys,
                             const std::vector<Bytes>& values) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(fd_, path_, true);
  catch_up();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    write_record(RecordKind::kSet, keys[i], values[i]);
  }
}

void FileStore::do_append(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(fd_, path_, true);
  catch_up();
  table_.check_append(key, value);
  write_record(RecordKind::kAppend, key, value);
}

}  // namespace comm
