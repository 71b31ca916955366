// Encrypted, mutually authenticated node links, bound to the cluster secret. Every holder of
// the secret derives the same certificate authority from it (an Ed25519 key stretched out of
// the secret with scrypt, and a certificate whose every field is fixed, so the same bytes on
// every node); each process makes a key pair of its own and a certificate signed by that
// authority. Both ends of a link present their certificate and accept only one the authority
// signed, so a caller without the secret is refused during the TLS handshake, before it can
// send any bytes of a call, and nobody on the network can read or alter what a link carries.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <string_view>

namespace strata::rpc {

// The name every node certificate carries and every caller checks: a node's identity is
// "holds a certificate of this cluster's authority", not a host name.
inline constexpr const char* kNodeCertificateName = "strata-node";

class LinkSecurity {
 public:
  // Derives the authority and makes this process's certificate; throws std::runtime_error
  // when OpenSSL fails (or `secret` is empty).
  explicit LinkSecurity(std::string_view secret);

  std::shared_ptr<grpc::ChannelCredentials> channel_credentials() const;
  std::shared_ptr<grpc::ServerCredentials> server_credentials() const;

  const std::string& authority_pem() const { return authority_pem_; }
  const std::string& certificate_pem() const { return certificate_pem_; }
  // This process's own key, for links that are not gRPC's (parallel/group_links.h).
  const std::string& private_key_pem() const { return private_key_pem_; }
  // SHA-256 of the authority's certificate (DER), as hex: equal on nodes of the same secret.
  const std::string& authority_fingerprint() const { return authority_fingerprint_; }

 private:
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials_;  // one for every channel, so that they share connections
  std::string authority_pem_;
  std::string authority_fingerprint_;
  std::string private_key_pem_;
  std::string certificate_pem_;
};

}  // namespace strata::rpc
