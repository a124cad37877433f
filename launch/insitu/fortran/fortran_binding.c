/* The array calls of the Fortran module: gfortran passes assumed-rank, assumed-type dummies
 * (type(*), dimension(..)) as ISO_Fortran_binding descriptors, and these functions turn each
 * into an mpigrad_array (Fortran order: the first dimension varies fastest, the batch is the
 * last) for the C API. One interface therefore serves arrays of every rank and kind. Nothing is
 * copied here: the descriptor's address, extents and byte strides are described as they are. */
#include <ISO_Fortran_binding.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpigrad/launch/insitu/c_api_internal.h"
#include "mpigrad/mpigrad_c.h"

/* Describes `descriptor` in `array`, its element strides in `strides`; on failure records the
 * error for `function` and returns its status. */
static mpigrad_status describe(const char* function, const char* name,
                               const CFI_cdesc_t* descriptor, mpigrad_array* array,
                               int64_t strides[MPIGRAD_MAX_RANK]) {
  char message[256];
  int d;
  if (descriptor == NULL || descriptor->base_addr == NULL) {
    snprintf(message, sizeof(message), "%s is not an allocated array", name);
    return mpigrad_record_error(function, MPIGRAD_ERROR_NULL_POINTER, message);
  }
  if (descriptor->rank < 1 || descriptor->rank > MPIGRAD_MAX_RANK) {
    snprintf(message, sizeof(message), "%s has rank %d; arrays of rank 1 to %d are accepted", name,
             (int)descriptor->rank, MPIGRAD_MAX_RANK);
    return mpigrad_record_error(function, MPIGRAD_ERROR_INVALID_ARGUMENT, message);
  }
  switch (descriptor->type) {
    case CFI_type_float:
      array->dtype = MPIGRAD_F32;
      break;
    case CFI_type_double:
      array->dtype = MPIGRAD_F64;
      break;
    case CFI_type_int32_t:
      array->dtype = MPIGRAD_I32;
      break;
    case CFI_type_int64_t:
      array->dtype = MPIGRAD_I64;
      break;
    default:
      snprintf(message, sizeof(message),
               "%s has Fortran type code %d; accepted are real(4), "
               "real(8), integer(4) and integer(8)",
               name, (int)descriptor->type);
      return mpigrad_record_error(function, MPIGRAD_ERROR_DTYPE, message);
  }
  array->data = descriptor->base_addr;
  array->rank = descriptor->rank;
  array->order = MPIGRAD_ORDER_FORTRAN;
  array->memory = MPIGRAD_MEMORY_HOST;
  array->device = 0;
  for (d = 0; d < MPIGRAD_MAX_RANK; ++d) array->shape[d] = 0;
  for (d = 0; d < descriptor->rank; ++d) {
    const CFI_index_t sm = descriptor->dim[d].sm;
    array->shape[d] = descriptor->dim[d].extent;
    if (sm <= 0 || sm % (CFI_index_t)descriptor->elem_len != 0) {
      snprintf(message, sizeof(message),
               "%s: dimension %d has a stride of %ld bytes; only "
               "positive strides of whole elements are accepted",
               name, d + 1, (long)sm);
      return mpigrad_record_error(function, MPIGRAD_ERROR_INVALID_ARGUMENT, message);
    }
    strides[d] = sm / (CFI_index_t)descriptor->elem_len;
  }
  array->strides = strides;
  return MPIGRAD_SUCCESS;
}

/* The Fortran calls put the optional loss last, after the stream. */
mpigrad_status mpigrad_fortran_train_step_on_stream(mpigrad_model model, const CFI_cdesc_t* input,
                                                    const CFI_cdesc_t* label, void* stream,
                                                    double* loss) {
  static const char* function = "mpigrad_train_step";
  mpigrad_array x, y;
  int64_t x_strides[MPIGRAD_MAX_RANK], y_strides[MPIGRAD_MAX_RANK];
  mpigrad_status status = describe(function, "input", input, &x, x_strides);
  if (status != MPIGRAD_SUCCESS) return status;
  status = describe(function, "label", label, &y, y_strides);
  if (status != MPIGRAD_SUCCESS) return status;
  return mpigrad_train_step_on_stream(model, &x, &y, loss, stream);
}

mpigrad_status mpigrad_fortran_train_step(mpigrad_model model, const CFI_cdesc_t* input,
                                          const CFI_cdesc_t* label, double* loss) {
  return mpigrad_fortran_train_step_on_stream(model, input, label, NULL, loss);
}

mpigrad_status mpigrad_fortran_predict_on_stream(mpigrad_model model, const CFI_cdesc_t* input,
                                                 const CFI_cdesc_t* output, void* stream) {
  static const char* function = "mpigrad_predict";
  mpigrad_array x, y;
  int64_t x_strides[MPIGRAD_MAX_RANK], y_strides[MPIGRAD_MAX_RANK];
  mpigrad_status status = describe(function, "input", input, &x, x_strides);
  if (status != MPIGRAD_SUCCESS) return status;
  status = describe(function, "output", output, &y, y_strides);
  if (status != MPIGRAD_SUCCESS) return status;
  return mpigrad_predict_on_stream(model, &x, &y, stream);
}

mpigrad_status mpigrad_fortran_predict(mpigrad_model model, const CFI_cdesc_t* input,
                                       const CFI_cdesc_t* output) {
  return mpigrad_fortran_predict_on_stream(model, input, output, NULL);
}

/* A list of Fortran arrays for the multi-array calls (TorchFort's torchfort_tensor_list): each
 * mpigrad_array_list_add describes one array in place, so the arrays must stay allocated (and
 * unmoved) until the call that uses the list. The list itself is malloc'd; mpigrad_array_list_
 * destroy frees it and clears the handle, so destroying twice is a no-op. */
typedef struct mpigrad_fortran_array_list {
  int32_t count, capacity;
  mpigrad_array* arrays;
  int64_t (*strides)[MPIGRAD_MAX_RANK];
} mpigrad_fortran_array_list;

mpigrad_status mpigrad_fortran_array_list_create(void** list) {
  mpigrad_fortran_array_list* created;
  if (list == NULL) {
    return mpigrad_record_error("mpigrad_array_list_create", MPIGRAD_ERROR_NULL_POINTER,
                                "list is NULL");
  }
  created = (mpigrad_fortran_array_list*)calloc(1, sizeof(mpigrad_fortran_array_list));
  if (created == NULL) {
    return mpigrad_record_error("mpigrad_array_list_create", MPIGRAD_ERROR_OUT_OF_MEMORY,
                                "cannot allocate a list");
  }
  *list = created;
  return MPIGRAD_SUCCESS;
}

mpigrad_status mpigrad_fortran_array_list_destroy(void** list) {
  mpigrad_fortran_array_list* owned;
  if (list == NULL || *list == NULL) return MPIGRAD_SUCCESS;
  owned = (mpigrad_fortran_array_list*)*list;
  free(owned->arrays);
  free(owned->strides);
  free(owned);
  *list = NULL;
  return MPIGRAD_SUCCESS;
}

mpigrad_status mpigrad_fortran_array_list_add(void* list, const CFI_cdesc_t* array) {
  static const char* function = "mpigrad_array_list_add";
  mpigrad_fortran_array_list* target = (mpigrad_fortran_array_list*)list;
  char name[32];
  int32_t i;
  if (target == NULL) {
    return mpigrad_record_error(function, MPIGRAD_ERROR_NULL_POINTER,
                                "the list was not created (mpigrad_array_list_create)");
  }
  if (target->count == target->capacity) {
    const int32_t capacity = target->capacity ? 2 * target->capacity : 4;
    mpigrad_array* arrays =
        (mpigrad_array*)realloc(target->arrays, (size_t)capacity * sizeof(mpigrad_array));
    int64_t(*strides)[MPIGRAD_MAX_RANK];
    if (arrays == NULL) {
      return mpigrad_record_error(function, MPIGRAD_ERROR_OUT_OF_MEMORY, "cannot grow the list");
    }
    target->arrays = arrays;
    strides = realloc(target->strides, (size_t)capacity * sizeof(*strides));
    if (strides == NULL) {
      return mpigrad_record_error(function, MPIGRAD_ERROR_OUT_OF_MEMORY, "cannot grow the list");
    }
    target->strides = strides;
    target->capacity = capacity;
    /* The strides moved: point every array described so far at its row again. */
    for (i = 0; i < target->count; ++i) target->arrays[i].strides = target->strides[i];
  }
  snprintf(name, sizeof(name), "array %d of the list", (int)target->count + 1);
  {
    const mpigrad_status status = describe(function, name, array, &target->arrays[target->count],
                                           target->strides[target->count]);
    if (status != MPIGRAD_SUCCESS) return status;
  }
  ++target->count;
  return MPIGRAD_SUCCESS;
}

static const mpigrad_fortran_array_list* list_or_empty(const void* list) {
  static const mpigrad_fortran_array_list empty = {0, 0, NULL, NULL};
  return list ? (const mpigrad_fortran_array_list*)list : &empty;
}

mpigrad_status mpigrad_fortran_train_step_multi(mpigrad_model model, const void* inputs,
                                                const void* labels, double* loss) {
  const mpigrad_fortran_array_list* x = list_or_empty(inputs);
  const mpigrad_fortran_array_list* y = list_or_empty(labels);
  return mpigrad_train_step_multi(model, x->count, x->arrays, y->count, y->arrays, loss);
}

mpigrad_status mpigrad_fortran_predict_multi(mpigrad_model model, const void* inputs,
                                             const void* outputs) {
  const mpigrad_fortran_array_list* x = list_or_empty(inputs);
  const mpigrad_fortran_array_list* y = list_or_empty(outputs);
  return mpigrad_predict_multi(model, x->count, x->arrays, y->count, y->arrays);
}

/* The atoms calls. An optional Fortran argument left out arrives as a NULL descriptor and
 * becomes a NULL array; a scalar (rank 0, one structure's energy) is described as an array of
 * one value. Atom numbers in edge_index are Fortran's, from 1. */
typedef struct fortran_atoms {
  mpigrad_array arrays[9];
  int64_t strides[9][MPIGRAD_MAX_RANK];
  const mpigrad_array* pointers[9];
} fortran_atoms;

static mpigrad_status describe_optional(const char* function, const char* name,
                                        const CFI_cdesc_t* descriptor, fortran_atoms* all,
                                        int slot) {
  all->pointers[slot] = NULL;
  if (descriptor == NULL) return MPIGRAD_SUCCESS;
  if (descriptor->rank == 0 && descriptor->base_addr != NULL) {
    mpigrad_array* array = &all->arrays[slot];
    mpigrad_status status;
    /* A scalar: describe it as what it is, then as one value. */
    CFI_CDESC_T(1) one;
    CFI_index_t extent[1] = {1};
    if (CFI_establish((CFI_cdesc_t*)&one, descriptor->base_addr, CFI_attribute_other,
                      descriptor->type, descriptor->elem_len, 1, extent) != CFI_SUCCESS) {
      return mpigrad_record_error(function, MPIGRAD_ERROR_INVALID_ARGUMENT, name);
    }
    status = describe(function, name, (const CFI_cdesc_t*)&one, array, all->strides[slot]);
    if (status != MPIGRAD_SUCCESS) return status;
    all->pointers[slot] = array;
    return MPIGRAD_SUCCESS;
  }
  {
    const mpigrad_status status =
        describe(function, name, descriptor, &all->arrays[slot], all->strides[slot]);
    if (status != MPIGRAD_SUCCESS) return status;
  }
  all->pointers[slot] = &all->arrays[slot];
  return MPIGRAD_SUCCESS;
}

/* Describes the nine arrays (positions, atomic_numbers, energy, forces, cell, pbc, num_atoms,
 * edge_index, edge_shifts) into `all` and `atoms`. */
static mpigrad_status describe_atoms(const char* function, const CFI_cdesc_t* const given[9],
                                     fortran_atoms* all, mpigrad_atoms* atoms) {
  static const char* names[9] = {"positions", "atomic_numbers", "energy",     "forces",     "cell",
                                 "pbc",       "num_atoms",      "edge_index", "edge_shifts"};
  int slot;
  for (slot = 0; slot < 9; ++slot) {
    const mpigrad_status status = describe_optional(function, names[slot], given[slot], all, slot);
    if (status != MPIGRAD_SUCCESS) return status;
  }
  atoms->positions = all->pointers[0];
  atoms->atomic_numbers = all->pointers[1];
  atoms->cell = all->pointers[4];
  atoms->pbc = all->pointers[5];
  atoms->num_atoms = all->pointers[6];
  atoms->edge_index = all->pointers[7];
  atoms->edge_shifts = all->pointers[8];
  atoms->index_base = 1;
  return MPIGRAD_SUCCESS;
}

mpigrad_status mpigrad_fortran_atoms_predict(mpigrad_model model, const CFI_cdesc_t* positions,
                                             const CFI_cdesc_t* atomic_numbers,
                                             const CFI_cdesc_t* energy, const CFI_cdesc_t* forces,
                                             const CFI_cdesc_t* cell, const CFI_cdesc_t* pbc,
                                             const CFI_cdesc_t* num_atoms,
                                             const CFI_cdesc_t* edge_index,
                                             const CFI_cdesc_t* edge_shifts) {
  const CFI_cdesc_t* const given[9] = {positions, atomic_numbers, energy,     forces,     cell,
                                       pbc,       num_atoms,      edge_index, edge_shifts};
  fortran_atoms all;
  mpigrad_atoms atoms;
  const mpigrad_status status = describe_atoms("mpigrad_atoms_predict", given, &all, &atoms);
  if (status != MPIGRAD_SUCCESS) return status;
  return mpigrad_atoms_predict(model, &atoms, all.pointers[2], all.pointers[3]);
}

mpigrad_status mpigrad_fortran_atoms_train_step(
    mpigrad_model model, const CFI_cdesc_t* positions, const CFI_cdesc_t* atomic_numbers,
    const CFI_cdesc_t* energy, const CFI_cdesc_t* forces, double* loss, const CFI_cdesc_t* cell,
    const CFI_cdesc_t* pbc, const CFI_cdesc_t* num_atoms, const CFI_cdesc_t* edge_index,
    const CFI_cdesc_t* edge_shifts) {
  const CFI_cdesc_t* const given[9] = {positions, atomic_numbers, energy,     forces,     cell,
                                       pbc,       num_atoms,      edge_index, edge_shifts};
  fortran_atoms all;
  mpigrad_atoms atoms;
  const mpigrad_status status = describe_atoms("mpigrad_atoms_train_step", given, &all, &atoms);
  if (status != MPIGRAD_SUCCESS) return status;
  return mpigrad_atoms_train_step(model, &atoms, all.pointers[2], all.pointers[3], loss);
}
