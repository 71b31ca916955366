#include "cluster/node_identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>

#include "rpc/auth.h"

namespace strata::cluster {
namespace {

namespace fs = std::filesystem;

fs::path state_directory(const std::string& state_dir) {
  if (!state_dir.empty()) return state_dir;
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg != nullptr && *xdg != '\0') return fs::path(xdg) / "strata";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return fs::path(home) / ".local" / "state" / "strata";
  }
  throw std::runtime_error("no --state-dir, XDG_STATE_HOME or HOME to keep this node's state in");
}

// The directory, made if it is not there (readable by this user only, then).
void make_state_directory(const fs::path& dir) {
  if (fs::create_directories(dir)) fs::permissions(dir, fs::perms::owner_all);
}

std::string read_line(const fs::path& file) {
  std::ifstream in(file);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

constexpr size_t kLocalSecretDigits = 64;

}  // namespace

std::string resolve_node_id(const std::string& given, const std::string& state_dir) {
  if (!given.empty()) return given;
  const fs::path dir = state_directory(state_dir);
  const fs::path file = dir / "node-id";
  if (std::string id = read_line(file); !id.empty()) return id;
  std::random_device random;
  char id[17];
  std::snprintf(id, sizeof id, "%08x%08x", random(), random());
  make_state_directory(dir);
  const fs::path partial = file.string() + ".partial";
  {
    std::ofstream out(partial);
    out << id << "\n";
    if (!out) throw std::runtime_error("cannot write the node id to " + file.string());
  }
  fs::rename(partial, file);
  return id;
}

std::string read_or_create_local_secret() {
  const fs::path dir = state_directory({});
  const fs::path file = dir / "local-secret";
  const auto refuse = [&](const std::string& why) {
    return std::runtime_error("cannot keep this user's local cluster secret in " + file.string() + ": " + why);
  };
  try {
    make_state_directory(dir);
  } catch (const fs::filesystem_error& e) {
    throw refuse(e.code().message());
  }
  struct stat info {};
  // A directory others may write to would let them put their own file, or a link, in its place.
  if (::stat(dir.c_str(), &info) != 0 || info.st_uid != ::getuid() || (info.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    throw refuse(dir.string() + " must be this user's, and writable by no one else (chmod 700 " + dir.string() + ")");
  }
  if (!fs::exists(fs::symlink_status(file))) {
    // Written whole under another name and moved into place without replacing, so that nodes
    // starting at the same time agree on one secret: the first move wins, the others read it. A
    // move never shows the file with a second link, which a reader would rightly refuse.
    const fs::path partial = file.string() + "." + rpc::fresh_nonce();
    const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) throw refuse(std::strerror(errno));
    const std::string secret = rpc::fresh_nonce() + rpc::fresh_nonce() + "\n";
    const bool written = ::write(fd, secret.data(), secret.size()) == static_cast<ssize_t>(secret.size()) && ::fsync(fd) == 0;
    ::close(fd);
    const bool moved =
        written && (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, file.c_str(), RENAME_NOREPLACE) == 0 ||
                    errno == EEXIST);
    const int move_error = errno;
    ::unlink(partial.c_str());
    if (!moved) throw refuse(std::strerror(written ? move_error : EIO));
  }
  // Read through the descriptor that was checked, never through a link: as ssh does with its
  // keys, a secret others can read, or that is some other file, keeps nobody out.
  const int fd = ::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) throw refuse(errno == ELOOP ? "it is a symbolic link" : std::strerror(errno));
  char text[kLocalSecretDigits + 2] = {};
  const bool private_file = ::fstat(fd, &info) == 0 && S_ISREG(info.st_mode) && info.st_uid == ::getuid() &&
                            (info.st_mode & (S_IRWXG | S_IRWXO)) == 0 && info.st_nlink == 1;
  const ssize_t length = private_file ? ::read(fd, text, sizeof text) : 0;
  ::close(fd);
  if (!private_file) {
    throw refuse("it must be a file of this user's, with no other link, readable by no one else (chmod 600 " +
                 file.string() + ")");
  }
  std::string secret(text, static_cast<size_t>(std::max<ssize_t>(length, 0)));
  if (secret.ends_with('\n')) secret.pop_back();
  if (secret.size() != kLocalSecretDigits ||
      secret.find_first_not_of("0123456789abcdef") != std::string::npos) {
    throw refuse("it is not " + std::to_string(kLocalSecretDigits) +
                 " hex digits; delete it and start again to make a new one");
  }
  return secret;
}

}  // namespace strata::cluster
