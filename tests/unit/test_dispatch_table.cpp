// The backend decision table (src/dispatch/decide.cpp) for devices this machine does not have:
// sm_75, sm_80, sm_86, sm_89, sm_90, sm_100, none; with generations missing from the build or
// unable to run a problem.
#include <cstdarg>
#include <cstddef>
#include <csetjmp>
#include <cstdint>
#include <string>

extern "C" {
#include <cmocka.h>
}

#include "dispatch/decide.h"

using namespace flashattn;

namespace {

struct Table {
    Candidate c[5];
    Table() {
        for (int i = 1; i < 5; ++i) c[i].compiled = true;
    }
};

DeviceSummary gpu(int major, int minor) { return {true, major, minor, ""}; }

void expect(const Decision &d, flashattn_status_t status, flashattn_backend_t backend) {
    if (d.status != status || (status == FLASHATTN_SUCCESS && d.backend != backend))
        fail_msg("got status %d backend %s (%s), expected status %d backend %s", d.status, backend_name(d.backend),
                 d.reason.c_str(), status, backend_name(backend));
    assert_false(d.reason.empty());
}

void test_auto_by_capability(void **) {
    Table t;
    expect(decide_backend(FLASHATTN_BACKEND_AUTO, {false, 0, 0, "no driver"}, t.c), FLASHATTN_SUCCESS, FLASHATTN_BACKEND_CPU);
    expect(decide_backend(FLASHATTN_BACKEND_AUTO, gpu(7, 5), t.c), FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA1);
    expect(decide_backend(FLASHATTN_BACKEND_AUTO, gpu(8, 0), t.c), FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA2);
    expect(decide_backend(FLASHATTN_BACKEND_AUTO, gpu(8, 6), t.c), FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA2);
    expect(decide_backend(FLASHATTN_BACKEND_AUTO, gpu(8, 9), t.c), FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA2);
    expect(decide_backend(FLASHATTN_BACKEND_AUTO, gpu(9, 0), t.c), FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA3);
    // Newer GPUs have no sm_90a code: FA2 through its PTX.
    expect(decide_backend(FLASHATTN_BACKEND_AUTO, gpu(10, 0), t.c), FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA2);
    expect(decide_backend(FLASHATTN_BACKEND_AUTO, gpu(12, 0), t.c), FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA2);
    // Too old for any GPU generation.
    expect(decide_backend(FLASHATTN_BACKEND_AUTO, gpu(7, 0), t.c), FLASHATTN_ERROR_NOT_SUPPORTED, FLASHATTN_BACKEND_CPU);
}

void test_auto_falls_back(void **) {
    Table t;
    t.c[FLASHATTN_BACKEND_FA3].unsupported = "head_dim 40 is not one of 64, 96, 128, 192, 256";
    Decision d = decide_backend(FLASHATTN_BACKEND_AUTO, gpu(9, 0), t.c);
    expect(d, FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA2);
    assert_true(d.reason.find("head_dim 40") != std::string::npos);  // says why FA3 was skipped
    t.c[FLASHATTN_BACKEND_FA2].unsupported = "no";
    expect(decide_backend(FLASHATTN_BACKEND_AUTO, gpu(9, 0), t.c), FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA1);
    t.c[FLASHATTN_BACKEND_FA1].unsupported = "no";
    d = decide_backend(FLASHATTN_BACKEND_AUTO, gpu(9, 0), t.c);
    expect(d, FLASHATTN_ERROR_NOT_SUPPORTED, FLASHATTN_BACKEND_CPU);
    assert_true(d.reason.find("fa3") != std::string::npos && d.reason.find("fa1") != std::string::npos);
    // A generation left out of the build counts as unable.
    Table u;
    u.c[FLASHATTN_BACKEND_FA3].compiled = false;
    d = decide_backend(FLASHATTN_BACKEND_AUTO, gpu(9, 0), u.c);
    expect(d, FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA2);
    assert_true(d.reason.find("built without fa3") != std::string::npos);
    // Auto never falls back from a GPU to the CPU: the data is on the device.
    expect(decide_backend(FLASHATTN_BACKEND_AUTO, gpu(7, 5), t.c), FLASHATTN_ERROR_NOT_SUPPORTED, FLASHATTN_BACKEND_CPU);
}

// A backend that runs the plan but defers to an older one (fa3 on decode shapes) is passed over
// by auto, taken when nothing older can run the plan, and still runs when forced.
void test_auto_pass(void **) {
    Table t;
    t.c[FLASHATTN_BACKEND_FA3].auto_pass = "fa3 has no split-KV path";
    Decision d = decide_backend(FLASHATTN_BACKEND_AUTO, gpu(9, 0), t.c);
    expect(d, FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA2);
    assert_true(d.reason.find("split-KV") != std::string::npos);
    t.c[FLASHATTN_BACKEND_FA2].unsupported = "no";
    t.c[FLASHATTN_BACKEND_FA1].unsupported = "no";
    d = decide_backend(FLASHATTN_BACKEND_AUTO, gpu(9, 0), t.c);
    expect(d, FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA3);
    assert_true(d.reason.find("only generation") != std::string::npos);
    expect(decide_backend(FLASHATTN_BACKEND_FA3, gpu(9, 0), t.c), FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA3);
}

void test_forced(void **) {
    Table t;
    expect(decide_backend(FLASHATTN_BACKEND_FA1, gpu(9, 0), t.c), FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA1);
    expect(decide_backend(FLASHATTN_BACKEND_CPU, gpu(9, 0), t.c), FLASHATTN_SUCCESS, FLASHATTN_BACKEND_CPU);
    t.c[FLASHATTN_BACKEND_FA2].unsupported = "fp32 is not supported";
    Decision d = decide_backend(FLASHATTN_BACKEND_FA2, gpu(9, 0), t.c);
    expect(d, FLASHATTN_ERROR_NOT_SUPPORTED, FLASHATTN_BACKEND_FA2);
    assert_true(d.reason.find("fp32") != std::string::npos);
    t.c[FLASHATTN_BACKEND_FA3].compiled = false;
    d = decide_backend(FLASHATTN_BACKEND_FA3, gpu(9, 0), t.c);
    expect(d, FLASHATTN_ERROR_NOT_SUPPORTED, FLASHATTN_BACKEND_FA3);
}

void test_names(void **) {
    flashattn_backend_t b;
    assert_true(parse_backend_name("fa2", &b));
    assert_int_equal(b, FLASHATTN_BACKEND_FA2);
    assert_true(parse_backend_name("auto", &b));
    assert_int_equal(b, FLASHATTN_BACKEND_AUTO);
    assert_false(parse_backend_name("FA2 ", &b));
    assert_false(parse_backend_name("", &b));
}

}  // namespace

// The backward's backend: the forward's when it has one; else, under auto, the newest generation
// for the device with a backward (Hopper: fa3 forward, fa2 backward); forced: not supported.
void test_backward_choice(void **) {
    Table t;
    t.c[FLASHATTN_BACKEND_FA1].unsupported = "fa1 has no backward pass";
    t.c[FLASHATTN_BACKEND_FA3].unsupported = "fa3 has no backward pass";
    const flashattn_backend_t AUTO = FLASHATTN_BACKEND_AUTO;
    expect(decide_backward_backend(AUTO, FLASHATTN_BACKEND_FA2, gpu(8, 0), t.c), FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA2);
    Decision d = decide_backward_backend(AUTO, FLASHATTN_BACKEND_FA3, gpu(9, 0), t.c);
    expect(d, FLASHATTN_SUCCESS, FLASHATTN_BACKEND_FA2);
    assert_true(d.reason.find("fa3 has no backward pass") != std::string::npos);
    expect(decide_backward_backend(AUTO, FLASHATTN_BACKEND_CPU, {false, 0, 0, "no driver"}, t.c), FLASHATTN_SUCCESS,
           FLASHATTN_BACKEND_CPU);
    // sm_75: fa1 forward, and fa2 cannot run there: nothing (the CPU is not a fallback for device memory).
    t.c[FLASHATTN_BACKEND_FA2].unsupported = "fa2 needs sm_80";
    expect(decide_backward_backend(AUTO, FLASHATTN_BACKEND_FA1, gpu(7, 5), t.c), FLASHATTN_ERROR_NOT_SUPPORTED,
           FLASHATTN_BACKEND_CPU);
    t.c[FLASHATTN_BACKEND_FA2].unsupported.clear();
    // Forced fa3: its backward or nothing, with a reason that says how to get one.
    d = decide_backward_backend(FLASHATTN_BACKEND_FA3, FLASHATTN_BACKEND_FA3, gpu(9, 0), t.c);
    expect(d, FLASHATTN_ERROR_NOT_SUPPORTED, FLASHATTN_BACKEND_CPU);
    assert_true(d.reason.find("auto") != std::string::npos);
    // fa3 with a backward: forced, it runs it; under auto, fa2's runs until kFa3BackwardUnderAuto.
    t.c[FLASHATTN_BACKEND_FA3].unsupported.clear();
    expect(decide_backward_backend(FLASHATTN_BACKEND_FA3, FLASHATTN_BACKEND_FA3, gpu(9, 0), t.c), FLASHATTN_SUCCESS,
           FLASHATTN_BACKEND_FA3);
    expect(decide_backward_backend(AUTO, FLASHATTN_BACKEND_FA3, gpu(9, 0), t.c), FLASHATTN_SUCCESS,
           kFa3BackwardUnderAuto ? FLASHATTN_BACKEND_FA3 : FLASHATTN_BACKEND_FA2);
    t.c[FLASHATTN_BACKEND_FA3].unsupported = "fa3 has no backward pass";
    // A backend left out of the build is named as such.
    t.c[FLASHATTN_BACKEND_FA2].compiled = false;
    d = decide_backward_backend(AUTO, FLASHATTN_BACKEND_FA3, gpu(9, 0), t.c);
    expect(d, FLASHATTN_ERROR_NOT_SUPPORTED, FLASHATTN_BACKEND_CPU);
    assert_true(d.reason.find("built without fa2") != std::string::npos);
}

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_by_capability),
        cmocka_unit_test(test_auto_falls_back),
        cmocka_unit_test(test_auto_pass),
        cmocka_unit_test(test_forced),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_backward_choice),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
