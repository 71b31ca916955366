// TLS 1.3 over a member's TCP connection to another member (group_links.h): both ends present a
// certificate of the cluster's authority and accept only one it signed.
#pragma once

#include <openssl/types.h>

#include <chrono>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "parallel/peer_stream.h"

namespace strata::parallel {

using Clock = std::chrono::steady_clock;

// Thrown when a deadline passes before a connection did its part.
class DeadlinePassed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class TlsContext {
 public:
  // Throws std::runtime_error naming the PEM OpenSSL could not read.
  TlsContext(const std::string& authority_pem, const std::string& certificate_pem, const std::string& private_key_pem);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  SSL_CTX* get() const { return context_; }

 private:
  SSL_CTX* context_;
};

enum class TlsRole { Dialer, Listener };

// Owns `socket`, which must be non-blocking. Writes never raise SIGPIPE.
class TlsStream final : public PeerStream {
 public:
  TlsStream(const TlsContext& context, int socket, TlsRole role);
  ~TlsStream() override;
  TlsStream(const TlsStream&) = delete;
  TlsStream& operator=(const TlsStream&) = delete;

  int socket() const override { return socket_; }
  // One step of the handshake: Waits::Nothing once it is done. Throws std::runtime_error saying
  // why it failed (a certificate not of the authority, on either side).
  Waits handshake();
  Moved send(std::span<const std::byte> bytes) override;
  Moved receive(std::span<std::byte> bytes) override;

 private:
  // What the call that returned `result` waits for; throws for a lost connection.
  Waits waits_after(int result, const char* doing);

  // How much one send encrypts before it sends: records collect up to this much, so that a
  // large part costs a syscall per buffer rather than per record (16 KiB).
  static constexpr size_t kWriteBuffer = 256 << 10;

  const int socket_;
  SSL* ssl_;
  BIO* written_ = nullptr;  // the buffer the SSL writes its records to, on the socket
  size_t encrypted_ = 0;    // bytes of the last send in `written_`, not yet reported moved
  bool broken_ = false;  // a fatal error: OpenSSL must not send a closing alert
};

// Move all of `bytes`, polling the stream's socket; throw DeadlinePassed when `deadline` comes
// first.
void finish_handshake(TlsStream& stream, Clock::time_point deadline);
void send_all(PeerStream& stream, std::span<const std::byte> bytes, Clock::time_point deadline);
void receive_all(PeerStream& stream, std::span<std::byte> bytes, Clock::time_point deadline);

}  // namespace strata::parallel
