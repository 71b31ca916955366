#include "cluster/gossip.h"

#include <future>

namespace strata::cluster {

Gossip::Gossip(GossipHost host, GossipTiming timing) : host_(std::move(host)), timing_(timing) {}

Gossip::~Gossip() { stop(); }

void Gossip::start() {
  thread_ = std::thread([this] { run(); });
}

void Gossip::act_now() {
  {
    std::lock_guard lock(mutex_);
    act_now_ = true;
  }
  wake_.notify_all();
}

void Gossip::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Gossip::run() {
  // address -> its Hello task. Declared before every lock of the loop, so destroyed after them:
  // its futures wait for their tasks, which take the lock.
  std::map<std::string, std::future<void>> hellos;
  while (true) {
    auto [targets, message] = host_.round();
    std::vector<std::string> addresses;
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      for (const std::string& address : targets) {
        const auto [entry, idle] = in_flight_.try_emplace(address);
        if (idle) {
          addresses.push_back(address);
        } else {
          entry->second = message.news;  // its task says it once its Hello returns
        }
      }
    }
    std::erase_if(hellos, [](const auto& entry) {
      return entry.second.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    });
    auto unanswered =
        std::make_shared<int>(static_cast<int>(addresses.size()));  // of this round's Hellos, under mutex_
    for (const std::string& address : addresses) {
      hellos[address] = std::async(std::launch::async, [this, address, message = message, unanswered] {
        greet_until_told(address, message, unanswered);
      });
    }
    {
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, timing_.hello_wait, [&] { return stopping_ || act_now_ || *unanswered == 0; });
      act_now_ = false;
      if (stopping_) return;
    }
    host_.act();
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, timing_.interval, [&] { return stopping_ || act_now_; });
    act_now_ = false;
    if (stopping_) return;
  }
}

void Gossip::greet_until_told(const std::string& address, HelloMessage said, const std::shared_ptr<int>& unanswered) {
  bool greeted = host_.greet(address, said.hello);
  {
    std::lock_guard lock(mutex_);
    --*unanswered;
  }
  wake_.notify_all();
  while (greeted) {
    const HelloNews now = host_.news();
    {
      // Decided under the lock that rounds pass addresses by under, so that no round's news
      // falls between this look and the address leaving in_flight_.
      std::lock_guard lock(mutex_);
      if (stopping_) break;
      std::optional<HelloNews>& passed_by = in_flight_.at(address);
      const bool told = now == said.news && (!passed_by || *passed_by == said.news);
      passed_by.reset();
      if (told) {
        in_flight_.erase(address);
        return;
      }
    }
    said = host_.message();
    greeted = host_.greet(address, said.hello);
  }
  std::lock_guard lock(mutex_);
  in_flight_.erase(address);  // a failed Hello is tried again by the next round
}

}  // namespace strata::cluster
