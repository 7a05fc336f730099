// Per-code-object extra slots (a cache keyed by the code object), under the
// names each Python version exports them.
#pragma once

#include <Python.h>

#if PY_VERSION_HEX >= 0x030C0000
#define SG_GET_EXTRA PyUnstable_Code_GetExtra
#define SG_SET_EXTRA PyUnstable_Code_SetExtra
#define SG_REQUEST_EXTRA PyUnstable_Eval_RequestCodeExtraIndex
#else
#define SG_GET_EXTRA _PyCode_GetExtra
#define SG_SET_EXTRA _PyCode_SetExtra
#define SG_REQUEST_EXTRA _PyEval_RequestCodeExtraIndex
#endif
