/* Public scalar codecs: thin wrappers over the one owner, formats/codec.h. */
#include "dsv4/formats.h"
#include "formats/codec.h"

uint8_t dsv4_e4m3_encode(float x) { return dsv4_e4m3_from_f32(x); }
float dsv4_e4m3_decode(uint8_t c) { return dsv4_e4m3_to_f32(c); }
uint16_t dsv4_bf16_encode(float x) { return dsv4_bf16_from_f32(x); }
float dsv4_bf16_decode(uint16_t b) { return dsv4_bf16_to_f32(b); }
uint8_t dsv4_e2m1_encode(float x) { return dsv4_e2m1_from_f32(x); }
float dsv4_e2m1_decode(uint8_t c) { return dsv4_e2m1_to_f32(c); }
float dsv4_e8m0_decode(uint8_t b) { return dsv4_e8m0_to_f32(b); }

int dsv4_qrule_group(dsv4_qrule r) { return (unsigned)r < DSV4_QRULE_COUNT ? dsv4_qrules[r].group : 0; }

const char *dsv4_qrule_name(dsv4_qrule r)
{
    static const char *const names[DSV4_QRULE_COUNT] = {"kv64", "act128", "mx32", "fp4_32"};
    return (unsigned)r < DSV4_QRULE_COUNT ? names[r] : "?";
}

uint8_t dsv4_qrule_scale_byte(dsv4_qrule r, float amax)
{
    if ((unsigned)r >= DSV4_QRULE_COUNT) return 255;
    return (uint8_t)(dsv4_qrule_exponent(&dsv4_qrules[r], amax) + 127);
}
