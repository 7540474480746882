/**
 * @file
 * Symbol visibility for the tfab public API.
 */
#ifndef TFAB_EXPORT_H
#define TFAB_EXPORT_H

/**
 * Marks a public declaration. While tfab itself is built (with -fvisibility=hidden), it
 * makes the symbol visible; for users of the headers it is empty.
 */
#if defined(TFAB_BUILDING) && defined(__GNUC__)
#define TFAB_EXPORT __attribute__((visibility("default")))
#else
#define TFAB_EXPORT
#endif

#endif
