/* Symbol visibility for libflashattn's public functions. */
#ifndef FLASHATTN_EXPORT_H
#define FLASHATTN_EXPORT_H

#if defined(_WIN32)
#  if defined(FLASHATTN_BUILDING)
#    define FLASHATTN_API __declspec(dllexport)
#  else
#    define FLASHATTN_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__)
#  define FLASHATTN_API __attribute__((visibility("default")))
#else
#  define FLASHATTN_API
#endif

#endif /* FLASHATTN_EXPORT_H */
