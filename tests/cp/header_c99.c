/* flashattn_cp.h compiles on its own as strict C99 (warnings as errors) and twice included. */
#include "flashattn/flashattn_cp.h"
#include "flashattn/flashattn_cp.h"

int main(void) {
    flashattn_cp_plan_t *plan = 0;
    return flashattn_cp_plan_create(&plan) == FLASHATTN_SUCCESS ? (flashattn_cp_plan_destroy(plan), 0) : 1;
}
