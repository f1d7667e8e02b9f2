// comm::FileStore: a store kept in one file, for processes on one host or on
// a shared file system (the file:// init method).
//
// The file is an append-only log of records (set, append, delete, and the
// count of open stores) guarded by flock: writers hold the lock exclusively
// while they append, readers share it while they catch up. Each FileStore
// replays only the records it has not seen yet into an in-memory table.
// Blocking calls re-read the file with a backoff that grows to 50 ms; the
// file system offers no portable way to be told of a change.
//
// Every FileStore on the path counts itself in the file; the last one to be
// destroyed removes the file. A process that dies without destroying its
// FileStore leaves the file behind, and a later job reusing the path would
// see the old keys: give each job its own path.
#pragma once

#include <mutex>
#include <string>

#include "store/key_value_table.h"
#include "store/store.h"

namespace comm {

class COMM_API FileStore final : public Store {
 public:
  // Opens (creating it if needed) the store at `path`. Throws SystemError
  // naming the path when it cannot be opened or locked.
  explicit FileStore(std::string path, Duration timeout = kDefaultTimeout);
  ~FileStore() override;

  const std::string& path() const { return path_; }

 private:
  enum class RecordKind : std::uint8_t {
    kSet = 1,
    kAppend = 2,
    kDelete = 3,
    kUsers = 4,  // the value is a decimal delta of the count of open stores
  };
  class FileLock;

  void do_set(const std::string& key, const Bytes& value) override;
  Bytes do_get(const std::string& key, Duration timeout) override;
  std::int64_t do_add(const std::string& key, std::int64_t delta) override;
  Bytes do_compare_set(const std::string& key, const Bytes& expected,
                       const Bytes& desired) override;
  void do_wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool do_check(const std::vector<std::string>& keys) override;
  bool do_delete_key(const std::string& key) override;
  std::int64_t do_num_keys() override;
  std::vector<Bytes> do_multi_get(const std::vector<std::string>& keys,
                                  Duration timeout) override;
  void do_multi_set(const std::vector<std::string>& keys,
                    const std::vector<Bytes>& values) override;
  void do_append(const std::string& key, const Bytes& value) override;

  // Opens path_ and takes the lock, reopening when the file it opened was
  // removed by the last user of an earlier round before the lock was won.
  void open_locked_file();
  // Replays the records appended since the last call. Needs the lock.
  void catch_up();
  // Appends one record to the file and applies it to the table. Needs the
  // exclusive lock and a table that has caught up.
  void write_record(RecordKind kind, const std::string& key,
                    const Bytes& value);
  void apply(RecordKind kind, const std::string& key, Bytes value);
  // Waits until all keys are in the table, re-reading the file with backoff.
  void wait_for(const std::vector<std::string>& keys, Duration timeout);

  std::string path_;
  int fd_ = -1;
  std::mutex mutex_;  // one thread of this process at a time in the file
  KeyValueTable table_;
  std::int64_t users_ = 0;
  std::int64_t read_offset_ = 0;
};

}  // namespace comm
