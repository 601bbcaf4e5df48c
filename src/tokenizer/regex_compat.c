/* tokenizers runs the pre-tokenizer patterns with Oniguruma; PCRE2 (with UTF + UCP) reads the
 * same syntax, except for a few escapes whose Unicode sets differ:
 *   \s  Oniguruma: White_Space. PCRE2: White_Space plus U+180E (it keeps U+180E in \h).
 *   \w  Oniguruma: Letter, Mark, Decimal_Number, Connector_Punctuation. PCRE2: L, N and '_'.
 *   \h  Oniguruma (Ruby syntax): a hex digit. PCRE2: horizontal space.
 * The translation spells \s \S \w \W out as Oniguruma means them and rejects \h \H, and the
 * negated forms inside a character class (which have no spelled-out form there). */
#include "core/error.h"
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

#define WS "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define WORD "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"

dsv4_status tok_regex_translate(const char *p, size_t n, char **out, size_t *out_len)
{
    size_t cap = n * (sizeof WS + 4) + 1;
    char *o = malloc(cap);
    if (!o) return dsv4_fail(DSV4_ERR_NO_MEMORY, "tokenizer.json: out of memory");
    size_t k = 0, i = 0;
    int in_class = 0;
#define EMIT(s) (memcpy(o + k, s, sizeof s - 1), k += sizeof s - 1)
    while (i < n) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            const char *neg_in_class = NULL;
            switch (d) {
            case 's':
                if (in_class) EMIT(WS);
                else EMIT("[" WS "]");
                break;
            case 'w':
                if (in_class) EMIT(WORD);
                else EMIT("[" WORD "]");
                break;
            case 'S':
                if (in_class) neg_in_class = "\\S";
                else EMIT("[^" WS "]");
                break;
            case 'W':
                if (in_class) neg_in_class = "\\W";
                else EMIT("[^" WORD "]");
                break;
            case 'h':
            case 'H':
                free(o);
                return dsv4_fail(DSV4_ERR_UNSUPPORTED,
                                 "tokenizer.json: pre-tokenizer pattern uses \\%c, which Oniguruma and PCRE2 read differently", d);
            default:
                o[k++] = c;
                o[k++] = d;
            }
            if (neg_in_class) {
                free(o);
                return dsv4_fail(DSV4_ERR_UNSUPPORTED, "tokenizer.json: pre-tokenizer pattern uses %s inside a character class",
                                 neg_in_class);
            }
            i += 2;
            continue;
        }
        if (!in_class && c == '[') { /* a class starts; a ']' right after '[' or '[^' is literal */
            in_class = 1;
            o[k++] = p[i++];
            if (i < n && p[i] == '^') o[k++] = p[i++];
            if (i < n && p[i] == ']') o[k++] = p[i++];
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') { /* POSIX [:name:] */
            const char *end = NULL;
            for (size_t j = i + 2; j + 1 < n; j++)
                if (p[j] == ':' && p[j + 1] == ']') {
                    end = p + j + 2;
                    break;
                }
            if (end) {
                memcpy(o + k, p + i, (size_t)(end - (p + i)));
                k += (size_t)(end - (p + i));
                i = (size_t)(end - p);
                continue;
            }
        }
        if (in_class && c == ']') in_class = 0;
        o[k++] = p[i++];
    }
#undef EMIT
    *out = o;
    *out_len = k;
    return DSV4_OK;
}
