/* A few helpers to print JSON from the tools. */
#ifndef TFAB_TOOLS_JSON_H
#define TFAB_TOOLS_JSON_H

#include <stdio.h>

/* Print s as a JSON string literal, quotes included (NULL prints null). */
static inline void json_str(FILE *f, const char *s)
{
	if (!s) {
		fputs("null", f);
		return;
	}
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

#endif
