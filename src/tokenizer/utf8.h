/* UTF-8 well-formedness (Unicode 15, §3.9 Table 3-7: no overlongs, no surrogates, ≤ U+10FFFF). */
#ifndef DSV4_TOKENIZER_UTF8_H
#define DSV4_TOKENIZER_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The sequence at s[0..n): > 0 its length when well-formed; 0 when ill-formed; < 0 when it is a
 * proper prefix of a well-formed sequence that the end of the input cut short. n ≥ 1. */
static inline int utf8_check(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int len;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return -1;
        uint8_t b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    }
    return len;
}

/* Length of the longest well-formed prefix of s[0..n). */
static inline size_t utf8_valid_prefix(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_check(s + i, n - i);
        if (k <= 0) break;
        i += (size_t)k;
    }
    return i;
}

/* Write code point cp (a Unicode scalar value) as UTF-8; returns the byte count (1..4). */
static inline size_t utf8_put(uint8_t *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decode the well-formed sequence of length len at s. */
static inline uint32_t utf8_decode(const uint8_t *s, int len)
{
    static const uint8_t lead_mask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t cp = s[0] & lead_mask[len];
    for (int i = 1; i < len; i++) cp = (cp << 6) | (s[i] & 0x3F);
    return cp;
}

#endif
