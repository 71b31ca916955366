#include "parallel/tls_link.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

namespace strata::parallel {
namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using Certificate = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;

// OpenSSL's queued reasons for the last failure, oldest first, and none left queued.
std::string openssl_errors() {
  std::string reasons;
  char reason[256];
  while (const unsigned long code = ERR_get_error()) {
    ERR_error_string_n(code, reason, sizeof reason);
    if (!reasons.empty()) reasons += "; ";
    reasons += reason;
  }
  return reasons.empty() ? "no reason given" : reasons;
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("group links: " + what + ": " + openssl_errors());
}

Bio memory_of(const std::string& pem) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  require(bio != nullptr, "a memory BIO");
  return bio;
}

Certificate certificate_of(const std::string& pem, const char* which) {
  Certificate certificate(PEM_read_bio_X509(memory_of(pem).get(), nullptr, nullptr, nullptr));
  require(certificate != nullptr, std::string("reading the ") + which + " (PEM)");
  return certificate;
}

// A socket BIO whose writes pass MSG_NOSIGNAL: a peer gone mid-write must be an error, not a
// SIGPIPE that ends the process. OpenSSL's own socket BIO writes with write(2).
int socket_of(BIO* bio) { return static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio))); }

int socket_write(BIO* bio, const char* data, int size) {
  BIO_clear_retry_flags(bio);
  const ssize_t n = ::send(socket_of(bio), data, static_cast<size_t>(size), MSG_NOSIGNAL);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_write(bio);
  return static_cast<int>(n);
}

int socket_read(BIO* bio, char* data, int size) {
  BIO_clear_retry_flags(bio);
  const ssize_t n = ::recv(socket_of(bio), data, static_cast<size_t>(size), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_read(bio);
  if (n == 0) BIO_set_flags(bio, BIO_FLAGS_IN_EOF);
  return static_cast<int>(n);
}

long socket_control(BIO* bio, int command, long, void*) {
  switch (command) {
    case BIO_CTRL_FLUSH:
      return 1;
    case BIO_CTRL_EOF:  // how OpenSSL tells a peer that closed from a failed read
      return BIO_test_flags(bio, BIO_FLAGS_IN_EOF) != 0 ? 1 : 0;
    default:
      return 0;
  }
}

const BIO_METHOD* socket_method() {
  static const BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR, "strata socket");
    require(m != nullptr && BIO_meth_set_write(m, socket_write) == 1 && BIO_meth_set_read(m, socket_read) == 1 &&
                BIO_meth_set_ctrl(m, socket_control) == 1,
            "a socket BIO method");
    return m;
  }();
  return method;
}

void wait_for(int socket, PeerStream::Waits waits, Clock::time_point deadline, const char* doing) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) throw DeadlinePassed(std::string("timed out ") + doing);
    pollfd polled{socket, poll_events(waits), 0};
    const int ready = ::poll(&polled, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (ready > 0) return;
    if (ready < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
  }
}

}  // namespace

TlsContext::TlsContext(const std::string& authority_pem, const std::string& certificate_pem,
                       const std::string& private_key_pem)
    : context_(SSL_CTX_new(TLS_method())) {
  require(context_ != nullptr, "a TLS context");
  try {
    const Certificate authority = certificate_of(authority_pem, "authority's certificate");
    const Certificate own = certificate_of(certificate_pem, "node's certificate");
    const Key key(PEM_read_bio_PrivateKey(memory_of(private_key_pem).get(), nullptr, nullptr, nullptr));
    require(key != nullptr, "reading the node's private key (PEM)");
    // OpenSSL caches a certificate's extensions when it first checks one, writing them into the
    // certificate: done here, before handshakes on several threads share them.
    for (X509* certificate : {authority.get(), own.get()}) X509_check_purpose(certificate, -1, 0);
    require(SSL_CTX_use_certificate(context_, own.get()) == 1 && SSL_CTX_use_PrivateKey(context_, key.get()) == 1 &&
                SSL_CTX_check_private_key(context_) == 1,
            "the node's certificate and key");
    // The authority alone is trusted, not the system's: only a holder of the cluster secret has
    // a certificate it signed.
    require(X509_STORE_add_cert(SSL_CTX_get_cert_store(context_), authority.get()) == 1, "trusting the authority");
    SSL_CTX_set_verify(context_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    require(SSL_CTX_set_min_proto_version(context_, TLS1_3_VERSION) == 1 &&
                SSL_CTX_set_max_proto_version(context_, TLS1_3_VERSION) == 1,
            "TLS 1.3");
    // A link lives as long as its group and is never resumed: no tickets after the handshake.
    require(SSL_CTX_set_num_tickets(context_, 0) == 1, "no session tickets");
    SSL_CTX_set_session_cache_mode(context_, SSL_SESS_CACHE_OFF);
    // The peer holds the authority already: only this node's certificate goes over.
    SSL_CTX_set_mode(context_, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_NO_AUTO_CHAIN);
    // Reads as much as the socket holds, up to many records, rather than a record's header,
    // then its body: a syscall per record would cost more than its decryption.
    SSL_CTX_set_read_ahead(context_, 1);
    SSL_CTX_set_default_read_buffer_len(context_, 256 << 10);
    // The gather's frames carry their lengths, so a peer's end without a closing alert is only
    // "closed its connection", not a TLS failure.
    SSL_CTX_set_options(context_, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
  } catch (...) {
    SSL_CTX_free(context_);
    throw;
  }
}

TlsContext::~TlsContext() { SSL_CTX_free(context_); }

TlsStream::TlsStream(const TlsContext& context, int socket, TlsRole role) : socket_(socket), ssl_(SSL_new(context.get())) {
  BIO* raw = ssl_ != nullptr ? BIO_new(socket_method()) : nullptr;
  BIO* buffered = raw != nullptr ? BIO_new(BIO_f_buffer()) : nullptr;
  if (buffered == nullptr || BIO_set_write_buffer_size(buffered, kWriteBuffer) != 1 || BIO_up_ref(raw) != 1) {
    BIO_free(buffered);
    BIO_free(raw);
    SSL_free(ssl_);
    ::close(socket_);
    require(false, "a TLS connection");
  }
  BIO_set_data(raw, reinterpret_cast<void*>(static_cast<intptr_t>(socket_)));
  BIO_set_init(raw, 1);
  // Reads straight from the socket; writes gather records in a buffer, sent in one syscall
  // each time it fills or is flushed (the SSL holds one reference of `raw` for each).
  written_ = BIO_push(buffered, raw);
  SSL_set_bio(ssl_, raw, written_);
  if (role == TlsRole::Dialer) {
    SSL_set_connect_state(ssl_);
  } else {
    SSL_set_accept_state(ssl_);
  }
}

TlsStream::~TlsStream() {
  // Tells the peer this end closed on purpose; no waiting for its answer.
  if (!broken_ && SSL_is_init_finished(ssl_)) {
    SSL_shutdown(ssl_);
    BIO_flush(written_);
  }
  SSL_free(ssl_);
  ::close(socket_);
}

PeerStream::Waits TlsStream::handshake() {
  ERR_clear_error();
  const int result = SSL_do_handshake(ssl_);
  return result == 1 ? Waits::Nothing : waits_after(result, "TLS handshake");
}

PeerStream::Moved TlsStream::send(std::span<const std::byte> bytes) {
  if (encrypted_ == 0) {
    // The same bytes again after a wait, as OpenSSL requires: nothing of them was reported.
    ERR_clear_error();
    const size_t chunk = std::min(bytes.size(), kWriteBuffer);
    const int result = SSL_write_ex(ssl_, bytes.data(), chunk, &encrypted_);
    if (result != 1) return {0, waits_after(result, "send")};
  }
  // Bytes count as moved once their records are out of the buffer, on the socket.
  ERR_clear_error();
  if (BIO_flush(written_) != 1) {
    if (BIO_should_retry(written_)) return {0, Waits::Writable};
    broken_ = true;
    throw std::runtime_error(std::string("send: ") + std::strerror(errno));
  }
  return {std::exchange(encrypted_, 0), Waits::Nothing};
}

PeerStream::Moved TlsStream::receive(std::span<std::byte> bytes) {
  ERR_clear_error();
  size_t received = 0;
  const int result = SSL_read_ex(ssl_, bytes.data(), bytes.size(), &received);
  return result == 1 ? Moved{received, Waits::Nothing} : Moved{0, waits_after(result, "receive")};
}

PeerStream::Waits TlsStream::waits_after(int result, const char* doing) {
  const int error_number = errno;  // of the socket call that failed, if one did
  const int error = SSL_get_error(ssl_, result);
  switch (error) {
    case SSL_ERROR_WANT_READ:
      return Waits::Readable;
    case SSL_ERROR_WANT_WRITE:
      return Waits::Writable;
    case SSL_ERROR_ZERO_RETURN:
      throw std::runtime_error("closed its connection");
    default:
      break;
  }
  broken_ = true;
  std::string why = std::string(doing) + ": ";
  if (error == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
    why += error_number != 0 ? std::strerror(error_number) : "the connection ended";
  } else {
    why += openssl_errors();
  }
  if (const long verified = SSL_get_verify_result(ssl_); verified != X509_V_OK) {
    why += " (its certificate: " + std::string(X509_verify_cert_error_string(verified)) + ")";
  }
  throw std::runtime_error(why);
}

void finish_handshake(TlsStream& stream, Clock::time_point deadline) {
  for (;;) {
    const PeerStream::Waits waits = stream.handshake();
    if (waits == PeerStream::Waits::Nothing) return;
    wait_for(stream.socket(), waits, deadline, "in the TLS handshake");
  }
}

void send_all(PeerStream& stream, std::span<const std::byte> bytes, Clock::time_point deadline) {
  for (size_t done = 0; done < bytes.size();) {
    const PeerStream::Moved moved = stream.send(bytes.subspan(done));
    done += moved.bytes;
    if (moved.bytes == 0) wait_for(stream.socket(), moved.waits, deadline, "sending");
  }
}

void receive_all(PeerStream& stream, std::span<std::byte> bytes, Clock::time_point deadline) {
  for (size_t done = 0; done < bytes.size();) {
    const PeerStream::Moved moved = stream.receive(bytes.subspan(done));
    done += moved.bytes;
    if (moved.bytes == 0) wait_for(stream.socket(), moved.waits, deadline, "waiting for an answer");
  }
}

}  // namespace strata::parallel
