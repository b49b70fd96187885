/*
 * html_text.c -- escaping and number formats for the HTML report (html_text.h).
 */
#include "report/html_text.h"

#include "base/format.h"

#include <inttypes.h>

void gm_html_escape(FILE *out, const char *text)
{
    if (!text)
        return;
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        switch (*c) {
        case '&':
            fputs("&amp;", out);
            break;
        case '<':
            fputs("&lt;", out);
            break;
        case '>':
            fputs("&gt;", out);
            break;
        case '"':
            fputs("&quot;", out);
            break;
        case '\'':
            fputs("&#39;", out);
            break;
        default:
            if ((*c < 0x20 && *c != '\n' && *c != '\t') || *c == 0x7f)
                fputs("&#xFFFD;", out);
            else
                putc(*c, out);
        }
    }
}

const char *gm_html_bytes(char *buffer, size_t size, uint64_t bytes)
{
    return gm_format_bytes(buffer, size, bytes);
}

const char *gm_html_grouped(char *buffer, size_t size, uint64_t value)
{
    char digits[24];
    int length = snprintf(digits, sizeof digits, "%" PRIu64, value);
    size_t used = 0;
    for (int i = 0; i < length && used + 1 < size; i++) {
        if (i && (length - i) % 3 == 0 && used + 2 < size)
            buffer[used++] = ',';
        buffer[used++] = digits[i];
    }
    if (size)
        buffer[used < size ? used : size - 1] = '\0';
    return buffer;
}
