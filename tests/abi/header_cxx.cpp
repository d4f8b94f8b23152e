// The public header must compile as strict C++ with warnings as errors, included twice.
#include "flashattn/flashattn.h"
#include "flashattn/flashattn.h"

#include <cstdio>

int main() {
    flashattn_plan_t *plan = nullptr;
    if (flashattn_plan_create(&plan) != FLASHATTN_SUCCESS) return 1;
    flashattn_plan_destroy(plan);
    if (flashattn_version() / 10000 != FLASHATTN_VERSION_MAJOR) return 1;
    std::printf("%s\n", flashattn_status_string(FLASHATTN_SUCCESS));
    return 0;
}
