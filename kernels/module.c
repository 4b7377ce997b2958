/*
 * kvobs.kernels._native: the module, assembled from the files of native.h, each adding its
 * functions and types.
 */
#include "native.h"

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_native",
    .m_doc = "kvobs's C kernels: the host block-copy loops, the vLLM block pool walk, and the "
             "per-key cores of the reuse profile, the thrash tracker and the residency "
             "sampler.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (copy_add(m) < 0 || pool_walk_add(m) < 0 || reuse_add(m) < 0 || thrash_add(m) < 0
            || residency_add(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
