// The error-test harness every loss family's tests fill: a fixture holds valid operands and outputs (outputs filled
// with kSentinel) and names each of its buffers; a case edits a fresh fixture into one bad argument; every entry point
// asked for must then throw lossfuse::Error with one of the expected codes (naming the expected argument, when one is
// given) and leave every buffer byte as it was.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "test_util.hpp"

namespace lftest {

// The buffers a fixture guards, by name: snapshot() before the call, untouched() after it.
class GuardedBuffers {
 public:
  void guard(const char* name, const Tensor& t) { items_.emplace_back(name, &t); }
  void snapshot() {
    before_.clear();
    for (const auto& item : items_) before_.push_back(item.second->storage);
  }
  [[nodiscard]] ::testing::AssertionResult untouched() const {
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (items_[i].second->storage != before_[i]) {
        return ::testing::AssertionFailure() << items_[i].first << " was modified before the error";
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  std::vector<std::pair<const char*, const Tensor*>> items_;
  std::vector<std::vector<std::uint8_t>> before_;
};

// One error case run over `entries`: for each, a fresh Fixture (a GuardedBuffers), `setup` edits it and returns the
// replacement views, `call(fixture, entry, views)` must throw one of `codes` (naming `argument` when it is not empty)
// with the guarded buffers untouched. `message` receives the last error's text.
template <class Fixture, class Entry, class Views>
void expect_entry_errors(const std::function<Views(Fixture&)>& setup, std::initializer_list<ErrorCode> codes,
                         std::initializer_list<Entry> entries,
                         const std::function<void(const Fixture&, Entry, const Views&)>& call,
                         const std::function<std::string(Entry)>& entry_name, const std::string& argument = {},
                         std::string* message = nullptr) {
  for (Entry e : entries) {
    SCOPED_TRACE(entry_name(e));
    Fixture f;
    const Views v = setup(f);
    f.snapshot();
    std::string msg;
    EXPECT_TRUE(throws_error([&] { call(f, e, v); }, codes, &msg));
    if (!argument.empty()) {
      try {
        call(f, e, v);
      } catch (const Error& err) {
        EXPECT_EQ(err.argument(), argument) << msg;
        EXPECT_NE(msg.find(argument), std::string::npos) << msg;
      } catch (...) {  // reported by throws_error above
      }
    }
    if (message != nullptr) *message = msg;
    EXPECT_TRUE(f.untouched());
  }
}

}  // namespace lftest
