/* libFuzzer target of the chat format: the input, cut at 0xFF bytes, gives a tools JSON text, a
 * tool call's arguments, message contents and a completion. Rendering a conversation around them
 * and reading the completion (both modes) may refuse them, but must not crash, leak or read out
 * of bounds; what renders measures the size it then writes, and an accepted completion reads as
 * the same JSON in both passes.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=c17 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc \
 *         tests/fuzz/fuzz_chat.c src/tokenizer/[a-z_]*.c src/core/json.c src/core/error.c src/core/file.c \
 *         $(pkg-config --cflags --libs libpcre2-8) -lm -o fuzz_chat
 * (tests/python/test_model_fuzz.py runs it for a bounded time.) */
#include "dsv4/tokenizer.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dsv4_set_warning_handler(NULL, NULL); /* unknown keys by the million: not on stderr */
    const char *part[5] = {"", "", "", "", ""};
    size_t len[5] = {0};
    int k = 0;
    part[0] = (const char *)data;
    for (size_t i = 0; i < size; i++) {
        if (data[i] == 0xFF && k < 4) {
            len[k] = (size_t)((const char *)data + i - part[k]);
            part[++k] = (const char *)data + i + 1;
        }
    }
    len[k] = (size_t)((const char *)data + size - part[k]);
    const dsv4_tool_call call = {"id1", 3, "f", 1, part[1], len[1]};
    const dsv4_chat_message msgs[5] = {
        {.role = DSV4_ROLE_SYSTEM, .content = part[2], .content_len = len[2], .tools = part[0], .tools_len = len[0]},
        {.role = DSV4_ROLE_USER, .content = part[3], .content_len = len[3]},
        {.role = DSV4_ROLE_ASSISTANT, .content = part[2], .content_len = len[2], .tool_calls = &call, .n_tool_calls = 1},
        {.role = DSV4_ROLE_TOOL, .content = part[3], .content_len = len[3], .tool_call_id = "id1", .tool_call_id_len = 3},
        {.role = DSV4_ROLE_TOOL, .content = part[2], .content_len = len[2]}};
    for (int mode = 0; mode < 2; mode++) {
        dsv4_prompt_options opt = {(dsv4_prompt_mode)mode, 0};
        size_t n = 0, m = 0;
        if (dsv4_prompt_render(msgs, 5, &opt, NULL, 0, &n) == DSV4_OK) {
            char *buf = malloc(n + 1);
            if (!buf || dsv4_prompt_render(msgs, 5, &opt, buf, n, &m) != DSV4_OK || m != n) abort();
            free(buf);
        }
        if (dsv4_completion_parse(part[4], len[4], (dsv4_prompt_mode)mode, NULL, 0, &n) == DSV4_OK) {
            char *a = malloc(n + 1), *b = malloc(n + 1);
            if (!a || !b || dsv4_completion_parse(part[4], len[4], (dsv4_prompt_mode)mode, a, n, &m) != DSV4_OK || m != n) abort();
            if (dsv4_completion_parse(part[4], len[4], (dsv4_prompt_mode)mode, b, n, &m) != DSV4_OK || memcmp(a, b, n)) abort();
            free(a);
            free(b);
        }
    }
    return 0;
}
