// Node links' TLS identity: every holder of a secret derives the same authority, byte for byte,
// and another secret another one; each process's certificate is its own and that authority's.
#include "rpc/tls.h"

#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <memory>

namespace strata::rpc {
namespace {

using Certificate = std::unique_ptr<X509, decltype(&X509_free)>;

Certificate parse(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  return Certificate(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), X509_free);
}

// Whether `leaf` verifies against `authority` as the only trusted root.
bool verifies(const std::string& leaf, const std::string& authority) {
  const Certificate root = parse(authority);
  const Certificate certificate = parse(leaf);
  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(X509_STORE_new(), X509_STORE_free);
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> context(X509_STORE_CTX_new(), X509_STORE_CTX_free);
  if (!root || !certificate || X509_STORE_add_cert(store.get(), root.get()) != 1 ||
      X509_STORE_CTX_init(context.get(), store.get(), certificate.get(), nullptr) != 1) {
    return false;
  }
  return X509_verify_cert(context.get()) == 1;
}

TEST(LinkSecurity, TheSameSecretGivesTheSameAuthorityByteForByte) {
  const LinkSecurity a("secret"), b("secret");
  EXPECT_EQ(a.authority_pem(), b.authority_pem());
  EXPECT_EQ(a.authority_fingerprint(), b.authority_fingerprint());
  EXPECT_NE(a.certificate_pem(), b.certificate_pem()) << "each process makes a key of its own";
  EXPECT_TRUE(verifies(a.certificate_pem(), b.authority_pem()));
  EXPECT_TRUE(verifies(b.certificate_pem(), a.authority_pem()));
}

TEST(LinkSecurity, AnotherSecretsAuthorityRefusesTheCertificate) {
  const LinkSecurity a("secret"), other("secres");
  EXPECT_NE(a.authority_fingerprint(), other.authority_fingerprint());
  EXPECT_FALSE(verifies(a.certificate_pem(), other.authority_pem()));
  EXPECT_FALSE(verifies(other.certificate_pem(), a.authority_pem()));
}

TEST(LinkSecurity, NeedsASecret) { EXPECT_THROW(LinkSecurity(""), std::runtime_error); }

}  // namespace
}  // namespace strata::rpc
