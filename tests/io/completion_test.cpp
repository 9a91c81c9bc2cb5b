// The errno table of decide_completion(), exercised without a kernel.
#include "io/completion.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace strata::io {
namespace {

RequestProgress progress(IoOp op, uint64_t length, uint64_t alignment = 4096) {
  RequestProgress p;
  p.op = op;
  p.length_bytes = length;
  p.alignment = alignment;
  return p;
}

TEST(DecideCompletion, FullTransferCompletes) {
  RequestProgress p = progress(IoOp::kRead, 8192);
  Decision d = decide_completion(p, 8192, {});
  EXPECT_EQ(d.action, NextAction::kComplete);
  EXPECT_EQ(p.done_bytes, 8192u);
}

TEST(DecideCompletion, ShortTransferResubmitsRemainder) {
  for (IoOp op : {IoOp::kRead, IoOp::kWrite}) {
    RequestProgress p = progress(op, 3 * 4096);
    EXPECT_EQ(decide_completion(p, 4096, {}).action, NextAction::kResubmitRemainder);
    EXPECT_EQ(p.done_bytes, 4096u);
    EXPECT_EQ(decide_completion(p, 4096, {}).action, NextAction::kResubmitRemainder);
    EXPECT_EQ(decide_completion(p, 4096, {}).action, NextAction::kComplete);
  }
}

TEST(DecideCompletion, MisalignedShortTransferFailsUnderDirectIo) {
  RequestProgress p = progress(IoOp::kRead, 8192);
  Decision d = decide_completion(p, 100, {});
  EXPECT_EQ(d.action, NextAction::kFail);
  EXPECT_EQ(d.code, StatusCode::kDataLoss);
  RequestProgress buffered = progress(IoOp::kRead, 8192, 1);
  EXPECT_EQ(decide_completion(buffered, 100, {}).action, NextAction::kResubmitRemainder);
}

TEST(DecideCompletion, ZeroByteReadIsShortRead) {
  RequestProgress p = progress(IoOp::kRead, 4096);
  Decision d = decide_completion(p, 0, {});
  EXPECT_EQ(d.action, NextAction::kFail);
  EXPECT_EQ(d.code, StatusCode::kDataLoss);
  EXPECT_NE(d.reason.find("short read"), std::string::npos);
}

TEST(DecideCompletion, ZeroByteWriteRetriesThenFails) {
  RetryPolicy policy;
  policy.max_transient_retries = 2;
  RequestProgress p = progress(IoOp::kWrite, 4096);
  EXPECT_EQ(decide_completion(p, 0, policy).action, NextAction::kRetry);
  EXPECT_EQ(decide_completion(p, 0, policy).action, NextAction::kRetry);
  Decision d = decide_completion(p, 0, policy);
  EXPECT_EQ(d.action, NextAction::kFail);
  EXPECT_EQ(d.code, StatusCode::kResourceExhausted);
}

TEST(DecideCompletion, TransientErrnosRetryWithinLimit) {
  for (int err : {EINTR, EAGAIN}) {
    RetryPolicy policy;
    policy.max_transient_retries = 3;
    RequestProgress p = progress(IoOp::kRead, 4096);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(decide_completion(p, -err, policy).action, NextAction::kRetry);
    Decision d = decide_completion(p, -err, policy);
    EXPECT_EQ(d.action, NextAction::kFail);
    EXPECT_EQ(d.code, StatusCode::kUnavailable);
  }
}

TEST(DecideCompletion, EioRetriesThenFails) {
  RetryPolicy policy;
  policy.max_eio_retries = 1;
  RequestProgress p = progress(IoOp::kWrite, 4096);
  EXPECT_EQ(decide_completion(p, -EIO, policy).action, NextAction::kRetry);
  Decision d = decide_completion(p, -EIO, policy);
  EXPECT_EQ(d.action, NextAction::kFail);
  EXPECT_EQ(d.code, StatusCode::kUnavailable);
  EXPECT_NE(d.reason.find("EIO"), std::string::npos);
}

TEST(DecideCompletion, ProgressResetsTheRetryCounts) {
  RetryPolicy policy;
  policy.max_eio_retries = 1;
  policy.max_transient_retries = 1;
  RequestProgress p = progress(IoOp::kRead, 3 * 4096);
  EXPECT_EQ(decide_completion(p, -EIO, policy).action, NextAction::kRetry);
  EXPECT_EQ(decide_completion(p, -EAGAIN, policy).action, NextAction::kRetry);
  EXPECT_EQ(decide_completion(p, 4096, policy).action, NextAction::kResubmitRemainder);
  EXPECT_EQ(decide_completion(p, -EIO, policy).action, NextAction::kRetry);
  EXPECT_EQ(decide_completion(p, -EINTR, policy).action, NextAction::kRetry);
  EXPECT_EQ(decide_completion(p, -EIO, policy).action, NextAction::kFail);
}

TEST(DecideCompletion, PerOperationTables) {
  RequestProgress w = progress(IoOp::kWrite, 4096);
  EXPECT_EQ(decide_completion(w, -ENOSPC, {}).code, StatusCode::kResourceExhausted);
  RequestProgress r = progress(IoOp::kRead, 4096);
  EXPECT_EQ(decide_completion(r, -ENOSPC, {}).code, StatusCode::kInternal);
  RequestProgress e = progress(IoOp::kRead, 4096);
  EXPECT_EQ(decide_completion(e, -EINVAL, {}).code, StatusCode::kInvalidArgument);
  RequestProgress c = progress(IoOp::kRead, 4096);
  EXPECT_EQ(decide_completion(c, -ECANCELED, {}).code, StatusCode::kCancelled);
  RequestProgress x = progress(IoOp::kRead, 4096);
  Decision d = decide_completion(x, -EPIPE, {});
  EXPECT_EQ(d.code, StatusCode::kInternal);
  EXPECT_NE(d.reason.find("EPIPE") == std::string::npos ? d.reason.find("errno") : 0, std::string::npos);
}

TEST(DecideCompletion, OverlongResultIsInternal) {
  RequestProgress p = progress(IoOp::kRead, 4096);
  EXPECT_EQ(decide_completion(p, 8192, {}).code, StatusCode::kInternal);
}

TEST(DecideCompletionDeathTest, EfaultIsAProgrammerError) {
  RequestProgress p = progress(IoOp::kRead, 4096);
  EXPECT_DEATH((void)decide_completion(p, -EFAULT, {}), "EFAULT");
}

}  // namespace
}  // namespace strata::io
