// A plan's workspace layout (src/base/workspace.h): slices on kWorkspaceAlignment boundaries in the
// order added, empty ones taking no room, and a slice that does not fit (past kMaxSlices, or a size
// whose aligned end passes size_t) refused with the layout marked invalid, which finalize turns
// into FLASHATTN_ERROR_INTERNAL (src/dispatch/dispatch.cpp, check_layouts) instead of an execute
// writing through a slice that was never laid out.
#include <cstdarg>
#include <cstddef>
#include <csetjmp>
#include <cstdint>
#include <cstring>
#include <vector>

extern "C" {
#include <cmocka.h>
}

#include "base/workspace.h"

using flashattn::kWorkspaceAlignment;
using flashattn::WorkspaceLayout;

namespace {

void slices_are_aligned_in_order(void **) {
    WorkspaceLayout w;
    const size_t sizes[] = {1, 0, 256, 257, 1000};
    size_t expect = 0;
    for (int i = 0; i < 5; ++i) {
        assert_int_equal(w.add("slice", sizes[i]), i);
        assert_true(w.offset(i) == expect);
        assert_true(w.bytes(i) == sizes[i]);
        assert_true(w.offset(i) % kWorkspaceAlignment == 0);
        expect += (sizes[i] + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
    }
    assert_true(w.total_bytes() == expect);
    assert_true(w.valid());
    std::vector<unsigned char> buffer(w.total_bytes());
    assert_true(w.at<unsigned char>(buffer.data(), 3) == buffer.data() + w.offset(3));
}

void a_slice_past_the_last_is_refused(void **) {
    WorkspaceLayout w;
    for (int i = 0; i < WorkspaceLayout::kMaxSlices; ++i) assert_int_equal(w.add("fits", 64), i);
    const size_t total = w.total_bytes();
    assert_int_equal(w.add("one too many", 64), -1);
    assert_false(w.valid());
    assert_string_equal(w.invalid_slice(), "one too many");
    assert_int_equal(w.slice_count(), WorkspaceLayout::kMaxSlices);
    assert_true(w.total_bytes() == total);  // nothing of it was laid out
}

void a_size_past_size_t_is_refused(void **) {
    WorkspaceLayout w;
    assert_int_equal(w.add("small", 100), 0);
    assert_int_equal(w.add("huge", SIZE_MAX - 10), -1);  // its aligned end wraps
    assert_false(w.valid());
    assert_string_equal(w.invalid_slice(), "huge");
    assert_int_equal(w.add("later", 8), 1);  // a later slice that fits leaves the layout invalid
    assert_false(w.valid());
    assert_string_equal(w.invalid_slice(), "huge");  // and names the first refused
    WorkspaceLayout v;
    assert_int_equal(v.add("half", SIZE_MAX / 2), 0);
    assert_int_equal(v.add("other half", SIZE_MAX / 2 + 2), -1);  // the sum wraps
    assert_false(v.valid());
    assert_true(v.total_bytes() >= SIZE_MAX / 2);
}

void an_empty_layout_is_valid(void **) {
    WorkspaceLayout w;
    assert_true(w.valid());
    assert_true(w.total_bytes() == 0);
    assert_string_equal(w.invalid_slice(), "");
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(slices_are_aligned_in_order),
        cmocka_unit_test(a_slice_past_the_last_is_refused),
        cmocka_unit_test(a_size_past_size_t_is_refused),
        cmocka_unit_test(an_empty_layout_is_valid),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
