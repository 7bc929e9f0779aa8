// Delta conversion identity in float32 (SPEC section 9): test_mhar's
// check_delta_conversion compiled with `real` = float, the precision the CPU
// trainer trains in (test_mhar itself runs it in float64). A std model is
// trained two steps, saved and converted (-init_from's path); the converted
// model's logits and loss must equal the std model's bit for bit (memcmp), the
// std gradients must equal the std model's, q/gamma/null's be exactly 0 and
// every alpha's non-zero. Ends with "N passed, N failed"; exits non-zero on a failure.
//   make dev/delta_identity && ./dev/delta_identity      (part of make test)
#define TEST_MHAR_NO_MAIN
#include "test_mhar.c"

int main(void) {
    check_delta_conversion("delta H=2 S=2", 2, 2);
    check_delta_conversion("delta H=4 S=3", 4, 3);
    check_delta_conversion("delta H=1 S=8", 1, 8);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
