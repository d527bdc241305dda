"""The Python array API standard (2025.12) over fabric's sessions: ``t.__array_namespace__()``
returns the namespace of ``t``'s session (``fabric.array_api.namespace(session)``), with which
libraries written against the standard (scikit-learn's ``array_api_dispatch``, SciPy,
array-api-extra) compute on the device unchanged.

This package sits just above ``fabric.arrays``: every function is a remote op numpy's
protocols already reach, under the standard's name, keywords and dtype rules. Its modules:
``dtypes`` (the dtypes, constants, promotion and dtype functions), ``elementwise``,
``functions`` (statistics, manipulation, searching, sorting, sets, indexing, ``astype``),
``linalg`` and ``fft`` (the extensions, ``xp.linalg`` and ``xp.fft``), ``namespace``
(creation on a session's devices, and ``__array_namespace_info__``). The functions of
tensors are also this package's own names (``fabric.array_api.sin(t)``); creation needs a
session's namespace.
"""

from __future__ import annotations

from fabric.array_api import fft, linalg
from fabric.array_api.dtypes import (DTYPES, bool, can_cast, complex64, complex128, e, finfo,
                                     float32, float64, iinfo, inf, int8, int16, int32, int64,
                                     isdtype, nan, newaxis, pi, result_type, uint8, uint16,
                                     uint32, uint64)
from fabric.array_api.elementwise import FUNCTIONS as _ELEMENTWISE
from fabric.array_api.functions import FUNCTIONS as _OTHERS
from fabric.array_api.namespace import API_VERSION, ArrayAPINamespace, Info, namespace
from fabric.arrays.tensor import ARRAY_NAMESPACE

__array_api_version__ = API_VERSION
globals().update(_ELEMENTWISE)
globals().update(_OTHERS)
ARRAY_NAMESPACE.append(namespace)  # t.__array_namespace__()

__all__ = sorted({"ArrayAPINamespace", "Info", "namespace", "fft", "linalg", "DTYPES", "can_cast",
                  "finfo", "iinfo", "isdtype", "result_type", "e", "inf", "nan", "newaxis",
                  "pi", *DTYPES, *_ELEMENTWISE, *_OTHERS})
