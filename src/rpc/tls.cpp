#include "rpc/tls.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <array>
#include <stdexcept>

namespace strata::rpc {
namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Certificate = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using Extension = std::unique_ptr<X509_EXTENSION, Deleter<X509_EXTENSION, X509_EXTENSION_free>>;

void require(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("TLS set-up failed: ") + what);
}

// scrypt's cost makes each guess at a short secret expensive for someone who recorded a
// certificate the authority signed (about 50 ms and 16 MiB a guess), once per process here.
constexpr uint64_t kScryptN = 1 << 14;
constexpr uint64_t kScryptR = 8;
constexpr uint64_t kScryptP = 1;
constexpr std::string_view kAuthoritySalt = "strata cluster authority v1";

Key authority_key(std::string_view secret) {
  std::array<unsigned char, 32> seed{};
  require(EVP_PBE_scrypt(secret.data(), secret.size(), reinterpret_cast<const unsigned char*>(kAuthoritySalt.data()),
                         kAuthoritySalt.size(), kScryptN, kScryptR, kScryptP, 64 << 20, seed.data(), seed.size()) == 1,
          "scrypt");
  Key key(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed.data(), seed.size()));
  OPENSSL_cleanse(seed.data(), seed.size());
  require(key != nullptr, "Ed25519 key from the secret");
  return key;
}

Key fresh_key() {
  Key key(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
  require(key != nullptr, "a fresh Ed25519 key");
  return key;
}

void add_extension(X509* certificate, X509* issuer, int nid, const char* value) {
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, issuer, certificate, nullptr, nullptr, 0);
  Extension extension(X509V3_EXT_conf_nid(nullptr, &context, nid, value));
  require(extension != nullptr && X509_add_ext(certificate, extension.get(), -1) == 1, "a certificate extension");
}

void set_name(X509* certificate, const char* common_name, bool also_issuer) {
  X509_NAME* name = X509_get_subject_name(certificate);
  require(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(common_name), -1,
                                     -1, 0) == 1,
          "a certificate name");
  if (also_issuer) require(X509_set_issuer_name(certificate, name) == 1, "a certificate issuer");
}

// Every field fixed, and Ed25519 signatures are deterministic: the same bytes wherever the
// same secret made it.
Certificate authority_certificate(EVP_PKEY* key) {
  Certificate certificate(X509_new());
  require(certificate != nullptr, "a certificate");
  X509* c = certificate.get();
  require(X509_set_version(c, X509_VERSION_3) == 1, "a certificate version");
  require(ASN1_INTEGER_set(X509_get_serialNumber(c), 1) == 1, "a serial number");
  require(ASN1_TIME_set_string_X509(X509_getm_notBefore(c), "20000101000000Z") == 1 &&
              ASN1_TIME_set_string_X509(X509_getm_notAfter(c), "99991231235959Z") == 1,
          "a validity");
  require(X509_set_pubkey(c, key) == 1, "a public key");
  set_name(c, "Strata cluster authority", true);
  add_extension(c, c, NID_basic_constraints, "critical,CA:TRUE");
  add_extension(c, c, NID_key_usage, "critical,keyCertSign");
  add_extension(c, c, NID_subject_key_identifier, "hash");
  require(X509_sign(c, key, nullptr) > 0, "signing the authority");
  return certificate;
}

Certificate node_certificate(EVP_PKEY* key, X509* authority, EVP_PKEY* authority_key) {
  Certificate certificate(X509_new());
  require(certificate != nullptr, "a certificate");
  X509* c = certificate.get();
  require(X509_set_version(c, X509_VERSION_3) == 1, "a certificate version");
  std::array<unsigned char, 16> serial{};
  require(RAND_bytes(serial.data(), serial.size()) == 1, "a random serial number");
  serial[0] &= 0x7f;  // positive
  std::unique_ptr<BIGNUM, Deleter<BIGNUM, BN_free>> number(BN_bin2bn(serial.data(), serial.size(), nullptr));
  require(number != nullptr && BN_to_ASN1_INTEGER(number.get(), X509_get_serialNumber(c)) != nullptr,
          "a serial number");
  // From a day back, for peers whose clocks are behind; the key lives only as long as the process.
  require(X509_gmtime_adj(X509_getm_notBefore(c), -24 * 3600) != nullptr &&
              ASN1_TIME_set_string_X509(X509_getm_notAfter(c), "99991231235959Z") == 1,
          "a validity");
  require(X509_set_pubkey(c, key) == 1, "a public key");
  set_name(c, kNodeCertificateName, false);
  require(X509_set_issuer_name(c, X509_get_subject_name(authority)) == 1, "a certificate issuer");
  add_extension(c, authority, NID_basic_constraints, "critical,CA:FALSE");
  add_extension(c, authority, NID_key_usage, "critical,digitalSignature");
  add_extension(c, authority, NID_ext_key_usage, "serverAuth,clientAuth");
  add_extension(c, authority, NID_subject_alt_name, (std::string("DNS:") + kNodeCertificateName).c_str());
  add_extension(c, authority, NID_authority_key_identifier, "keyid:always");
  require(X509_sign(c, authority_key, nullptr) > 0, "signing the node certificate");
  return certificate;
}

std::string pem_of(X509* certificate) {
  Bio bio(BIO_new(BIO_s_mem()));
  require(bio != nullptr && PEM_write_bio_X509(bio.get(), certificate) == 1, "writing a certificate");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

std::string pem_of(EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  require(bio != nullptr && PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) == 1,
          "writing a private key");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

std::string fingerprint_of(X509* certificate) {
  std::array<unsigned char, SHA256_DIGEST_LENGTH> digest{};
  unsigned int length = 0;
  require(X509_digest(certificate, EVP_sha256(), digest.data(), &length) == 1, "a certificate fingerprint");
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex += kDigits[digest[i] >> 4];
    hex += kDigits[digest[i] & 15];
  }
  return hex;
}

}  // namespace

LinkSecurity::LinkSecurity(std::string_view secret) {
  if (secret.empty()) throw std::runtime_error("node links need a secret to derive their authority from");
  const Key authority = authority_key(secret);
  const Certificate authority_cert = authority_certificate(authority.get());
  const Key own = fresh_key();
  const Certificate own_cert = node_certificate(own.get(), authority_cert.get(), authority.get());
  authority_pem_ = pem_of(authority_cert.get());
  authority_fingerprint_ = fingerprint_of(authority_cert.get());
  private_key_pem_ = pem_of(own.get());
  certificate_pem_ = pem_of(own_cert.get());
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = authority_pem_;
  options.pem_private_key = private_key_pem_;
  options.pem_cert_chain = certificate_pem_;
  channel_credentials_ = grpc::SslCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> LinkSecurity::channel_credentials() const { return channel_credentials_; }

std::shared_ptr<grpc::ServerCredentials> LinkSecurity::server_credentials() const {
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = authority_pem_;
  options.pem_key_cert_pairs.push_back({private_key_pem_, certificate_pem_});
  return grpc::SslServerCredentials(options);
}

}  // namespace strata::rpc
