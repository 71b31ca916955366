// Announcements are judged without sockets here; multicast itself is tested in network
// namespaces by netns_test.sh.
#include "cluster/discovery.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "rpc/auth.h"

namespace strata::cluster {
namespace {

constexpr int64_t kNow = 1'700'000'000'000;

Announcement node(const std::string& id, const std::string& host) {
  return {.node_id = id, .host = host, .node_port = 8081, .model_hash = "abc123", .protocol_version = 1};
}

class DiscoveryTest : public ::testing::Test {
 protected:
  Verdict judge(const std::string& datagram, const std::string& source = "10.0.0.2", int64_t now = kNow) {
    return judge_announcement(datagram, source, receiver_, key_, now);
  }
  std::string signed_by(const Announcement& a, const rpc::ClusterKey& key, int64_t time = kNow) {
    return encode_announcement(a, key, time, rpc::fresh_nonce());
  }

  rpc::ClusterKey key_{"secret"};
  Announcement sender_ = node("b", "10.0.0.2");
  Announcement receiver_ = node("a", "10.0.0.1");
};

TEST_F(DiscoveryTest, RoundTripGivesTheSourceAndNodePort) {
  const Verdict v = judge(signed_by(sender_, key_));
  ASSERT_EQ(v.kind, Verdict::Kind::Found) << v.why;
  EXPECT_EQ(v.announcement.node_id, "b");
  EXPECT_EQ(v.announcement.host, "10.0.0.2");
  EXPECT_EQ(v.announcement.node_port, 8081);
  EXPECT_EQ(v.announcement.model_hash, "abc123");
  EXPECT_EQ(v.announcement.protocol_version, 1u);
  EXPECT_EQ(v.address, "10.0.0.2:8081");
}

TEST_F(DiscoveryTest, TheAnnouncementIsJsonWithAMac) {
  const auto message = nlohmann::json::parse(signed_by(sender_, key_));
  EXPECT_EQ(message.at("node_id"), "b");
  EXPECT_EQ(message.at("time"), kNow);
  EXPECT_EQ(message.at("mac").get<std::string>().size(), 64u);
  EXPECT_EQ(message.at("nonce").get<std::string>().size(), 32u);
}

TEST_F(DiscoveryTest, OwnAnnouncementIsRecognised) {
  EXPECT_EQ(judge(signed_by(node("a", "10.0.0.2"), key_)).kind, Verdict::Kind::Own);
}

TEST_F(DiscoveryTest, AnotherKeyIsRefused) {
  const Verdict v = judge(signed_by(sender_, rpc::ClusterKey("other")));
  EXPECT_EQ(v.kind, Verdict::Kind::Refused);
  EXPECT_NE(v.why.find("wrong MAC"), std::string::npos) << v.why;
}

TEST_F(DiscoveryTest, MissingMacIsRefused) {
  auto message = nlohmann::json::parse(signed_by(sender_, key_));
  message.erase("mac");
  const Verdict v = judge(message.dump());
  EXPECT_EQ(v.kind, Verdict::Kind::Refused);
  EXPECT_NE(v.why.find("without a cluster-key MAC"), std::string::npos) << v.why;
}

TEST_F(DiscoveryTest, AChangedFieldBreaksTheMac) {
  auto message = nlohmann::json::parse(signed_by(sender_, key_));
  message["node_port"] = 9999;
  EXPECT_EQ(judge(message.dump()).kind, Verdict::Kind::Refused);
}

TEST_F(DiscoveryTest, TimeMoreThanAMinuteOffIsRefused) {
  EXPECT_EQ(judge(signed_by(sender_, key_, kNow - 61'000)).kind, Verdict::Kind::Refused);
  EXPECT_EQ(judge(signed_by(sender_, key_, kNow + 61'000)).kind, Verdict::Kind::Refused);
  EXPECT_EQ(judge(signed_by(sender_, key_, kNow - 59'000)).kind, Verdict::Kind::Found);
}

TEST_F(DiscoveryTest, AnnouncementFromAnotherHostIsRefused) {
  const Verdict v = judge(signed_by(sender_, key_), "10.0.0.9");
  EXPECT_EQ(v.kind, Verdict::Kind::Refused);
  EXPECT_NE(v.why.find("replay"), std::string::npos) << v.why;
}

TEST_F(DiscoveryTest, AnotherModelOrProtocolIsIncompatible) {
  Announcement other_model = sender_;
  other_model.model_hash = "def456";
  const Verdict model = judge(signed_by(other_model, key_));
  EXPECT_EQ(model.kind, Verdict::Kind::Incompatible);
  EXPECT_NE(model.why.find("another model"), std::string::npos) << model.why;

  Announcement other_protocol = sender_;
  other_protocol.protocol_version = 2;
  const Verdict protocol = judge(signed_by(other_protocol, key_));
  EXPECT_EQ(protocol.kind, Verdict::Kind::Incompatible);
  EXPECT_NE(protocol.why.find("protocol 2"), std::string::npos) << protocol.why;
}

TEST_F(DiscoveryTest, ANodeWithoutAModelFindsAnyModelAndIsNotPlacedWithOne) {
  Announcement modelless = sender_;
  modelless.model_hash.clear();
  const Verdict seen = judge(signed_by(modelless, key_));
  EXPECT_EQ(seen.kind, Verdict::Kind::Incompatible);
  EXPECT_NE(seen.why.find("no model yet"), std::string::npos) << seen.why;

  receiver_.model_hash.clear();
  Announcement other_model = sender_;
  other_model.model_hash = "def456";
  EXPECT_EQ(judge(signed_by(other_model, key_)).kind, Verdict::Kind::Found);
}

TEST_F(DiscoveryTest, MalformedDatagramsAreRefused) {
  for (const std::string datagram : {"", "{", "[]", "42", "{\"mac\": 3}", "\xff\xfe", "{\"mac\": \"00\"}"}) {
    EXPECT_EQ(judge(datagram).kind, Verdict::Kind::Refused) << datagram;
  }
  EXPECT_EQ(judge(std::string(kMaxAnnouncementBytes + 1, ' ')).kind, Verdict::Kind::Refused);
}

TEST(DiscoveryOptionsTest, NeedsAKeyAKnownInterfaceAndAShortId) {
  EXPECT_THROW(Discovery({.key = nullptr}), std::runtime_error);
  EXPECT_THROW(rpc::ClusterKey(""), std::invalid_argument);
  EXPECT_THROW(multicast_interfaces("no-such-interface0"), std::runtime_error);
  // Receivers would refuse its announcements as too big: it is refused before it starts.
  const auto key = std::make_shared<rpc::ClusterKey>("secret");
  EXPECT_THROW(Discovery({.self = node(std::string(kMaxAnnouncementBytes, 'x'), ""), .key = key}), std::runtime_error);
}

}  // namespace
}  // namespace strata::cluster
