/* The public header must compile as strict C99 with warnings as errors, included twice. */
#include "flashattn/flashattn.h"
#include "flashattn/flashattn.h"

#include <stdio.h>

int main(void) {
    flashattn_plan_t *plan = NULL;
    if (flashattn_plan_create(&plan) != FLASHATTN_SUCCESS) return 1;
    flashattn_plan_destroy(plan);
    if (flashattn_version() / 10000 != FLASHATTN_VERSION_MAJOR) return 1;
    printf("%s\n", flashattn_version_string());
    return 0;
}
