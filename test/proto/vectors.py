#!/usr/bin/env python3
"""Reference vectors for the TensorProto compatibility test.

usage: vectors.py PROTOC REFERENCE_PROTO OUTPUT_HEADER

Each case is a tensor written in protobuf text format and encoded by protoc --encode against
test/proto/tf_reference.proto (an encoder independent of tfab's). The header it writes holds,
per case, protoc's bytes and what tfab must make of them: dtype, shape, and the raw content
(numeric) or the strings. "encode" cases are ones tfab's encoder must reproduce byte for byte
(numeric tensors as tensor_content, string tensors as string_val); the others are forms that
TensorFlow's Tensor::FromProto accepts and tfab only reads (the typed *_val fields, a missing
shape...). A second table holds TensorProtos that TensorFlow refuses, which tfab must refuse.
"""
import struct
import subprocess
import sys

# DLPack (code, bits) and TensorFlow DataType of each numeric kind, with a struct format.
KINDS = {
    "float32": (2, 32, "DT_FLOAT", "f"),
    "float64": (2, 64, "DT_DOUBLE", "d"),
    "float16": (2, 16, "DT_HALF", "H"),
    "bfloat16": (4, 16, "DT_BFLOAT16", "H"),
    "int8": (0, 8, "DT_INT8", "b"),
    "int16": (0, 16, "DT_INT16", "h"),
    "int32": (0, 32, "DT_INT32", "i"),
    "int64": (0, 64, "DT_INT64", "q"),
    "uint8": (1, 8, "DT_UINT8", "B"),
    "uint16": (1, 16, "DT_UINT16", "H"),
    "uint32": (1, 32, "DT_UINT32", "I"),
    "uint64": (1, 64, "DT_UINT64", "Q"),
    "complex64": (5, 64, "DT_COMPLEX64", "ff"),
    "complex128": (5, 128, "DT_COMPLEX128", "dd"),
    "bool": (6, 8, "DT_BOOL", "B"),
    "float8_e5m2": (12, 8, "DT_FLOAT8_E5M2", "B"),
    "float8_e4m3fn": (10, 8, "DT_FLOAT8_E4M3FN", "B"),
    "float8_e4m3fnuz": (11, 8, "DT_FLOAT8_E4M3FNUZ", "B"),
    "float8_e4m3b11fnuz": (9, 8, "DT_FLOAT8_E4M3B11FNUZ", "B"),
    "float8_e5m2fnuz": (13, 8, "DT_FLOAT8_E5M2FNUZ", "B"),
}


def text_bytes(b):
    return '"' + "".join("\\%03o" % x for x in b) + '"'


def shape_text(shape):
    return "tensor_shape { " + " ".join("dim { size: %d }" % d for d in shape) + " }"


def pattern(n):
    """The content tfab's test builds too: byte i is (i * 37 + 11) mod 256."""
    return bytes((i * 37 + 11) & 0xFF for i in range(n))


def count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


cases = []  # (name, kind, shape, text, expected content or strings, encode)

# Numeric tensors as tensor_content: every dtype, one shape; the bytes tfab writes.
for name, (code, bits, dt, fmt) in KINDS.items():
    shape = [2, 3]
    content = pattern(count(shape) * bits // 8)
    if name == "bool":
        content = bytes(x & 1 for x in content)
    text = "dtype: %s %s tensor_content: %s" % (dt, shape_text(shape), text_bytes(content))
    cases.append(("content_" + name, name, shape, text, content, True))
# A scalar, and an empty tensor (no content field at all).
cases.append(("scalar_float32", "float32", [], "dtype: DT_FLOAT tensor_shape { } "
              "tensor_content: " + text_bytes(pattern(4)), pattern(4), True))
cases.append(("empty_int32", "int32", [0, 5], "dtype: DT_INT32 " + shape_text([0, 5]),
              b"", True))

# String tensors: empty strings, binary bytes, a scalar, an empty tensor.
STRS = [b"", b"hello", bytes([0, 0xFF, 0x80, 0xC3, 0x28]), b"x" * 300]
for sname, shape, strs in [("strings_vector", [4], STRS),
                           ("strings_matrix", [2, 2], STRS),
                           ("strings_scalar", [], [b"only"]),
                           ("strings_empty", [2, 0], [])]:
    text = "dtype: DT_STRING %s %s" % (shape_text(shape),
                                       " ".join("string_val: " + text_bytes(s) for s in strs))
    cases.append((sname, "string", shape, text, strs, True))


def pack(kind, values):
    fmt = KINDS[kind][3]
    return b"".join(struct.pack("<" + fmt, *(v if isinstance(v, tuple) else (v,)))
                    for v in values)


def decoded(name, kind, shape, text, expect):
    """A TensorProto that tfab reads (never writes): shape and expect are what it must give."""
    cases.append((name, kind, shape, text, expect, False))


def typed(name, kind, shape, field_text, values):
    dt = KINDS[kind][2]
    decoded(name, kind, shape, "dtype: %s %s %s" % (dt, shape_text(shape), field_text),
            pack(kind, values))


def strings_read(name, shape, field_text, strs):
    decoded(name, "string", shape, "dtype: DT_STRING %s %s" % (shape_text(shape), field_text),
            strs)


# Typed fields as TensorFlow's Tensor::FromProto reads them (tensor.cc, FromProtoField).
typed("double_val", "float64", [2], "double_val: -2.25 double_val: 1e300", [-2.25, 1e300])
typed("int_val_uint16", "uint16", [2], "int_val: 65535 int_val: 7", [65535, 7])
typed("int_val_int32", "int32", [2], "int_val: -2147483648 int_val: 5", [-2147483648, 5])
typed("half_val_bfloat16", "bfloat16", [1], "half_val: 16256", [16256])
typed("int64_val", "int64", [2], "int64_val: -9000000000 int64_val: 3", [-9000000000, 3])
typed("uint32_val", "uint32", [1], "uint32_val: 4000000000", [4000000000])
typed("dcomplex_val", "complex128", [1], "dcomplex_val: 0.5 dcomplex_val: 2", [(0.5, 2.0)])
# A quantized DataType reads as the plain integer of its width.
decoded("quantized_qint8", "int8", [2],
        "dtype: DT_QINT8 %s int_val: -3 int_val: 4" % shape_text([2]), pack("int8", [-3, 4]))

# Fewer values than elements: the last one repeats.
typed("repeat_float_val", "float32", [3], "float_val: 1.5", [1.5, 1.5, 1.5])
typed("repeat_int_val_int8", "int8", [3], "int_val: -1 int_val: 127", [-1, 127, 127])
typed("repeat_half_val", "float16", [2], "half_val: 15360", [15360, 15360])
typed("repeat_uint64_val", "uint64", [2], "uint64_val: 18446744073709551615",
      [18446744073709551615, 18446744073709551615])
typed("repeat_bool_val", "bool", [3], "bool_val: true bool_val: false", [1, 0, 0])
typed("repeat_scomplex_val", "complex64", [2], "scomplex_val: 1 scomplex_val: -1",
      [(1.0, -1.0), (1.0, -1.0)])
typed("repeat_float8_val", "float8_e4m3fn", [3],
      "float8_val: " + text_bytes(bytes([0x38, 0xC0])), [0x38, 0xC0, 0xC0])
strings_read("repeat_string_val", [3], 'string_val: "a" string_val: "bc"', [b"a", b"bc", b"bc"])

# More values than elements: TensorFlow copies as many as there are elements, and complex
# fields count whole (real, imaginary) pairs, so an odd last part is dropped too.
typed("more_float_val", "float32", [2], "float_val: 1 float_val: 2 float_val: 3", [1.0, 2.0])
typed("more_int_val_uint8", "uint8", [1], "int_val: 300 int_val: 5", [300 & 0xFF])
typed("more_int64_val", "int64", [], "int64_val: 5 int64_val: 6", [5])
typed("more_half_val", "bfloat16", [1], "half_val: 16256 half_val: 1", [16256])
typed("more_bool_val", "bool", [2], "bool_val: true bool_val: false bool_val: true", [1, 0])
typed("more_float8_val", "float8_e5m2", [2], "float8_val: " + text_bytes(bytes([1, 2, 3])),
      [1, 2])
typed("more_scomplex_odd", "complex64", [1], "scomplex_val: 1 scomplex_val: 2 scomplex_val: 3",
      [(1.0, 2.0)])
typed("more_dcomplex_val", "complex128", [1],
      "dcomplex_val: 1 dcomplex_val: 2 dcomplex_val: 3 dcomplex_val: 4", [(1.0, 2.0)])
strings_read("more_string_val", [2], 'string_val: "a" string_val: "b" string_val: "c"',
             [b"a", b"b"])

# No values at all: the type's zero (an empty string for strings).
typed("none_int32", "int32", [3], "", [0, 0, 0])
typed("none_float64", "float64", [2, 1], "", [0.0, 0.0])
typed("none_scomplex_half", "complex64", [1], "scomplex_val: 3", [(0.0, 0.0)])  # half a value
strings_read("none_string", [2], "", [b"", b""])

# No tensor_shape: TensorFlow reads the default TensorShapeProto, no dimensions, a scalar.
decoded("no_shape_float_val", "float32", [], "dtype: DT_FLOAT float_val: 2.5",
        pack("float32", [2.5]))
decoded("no_shape_content", "int64", [], "dtype: DT_INT64 tensor_content: " +
        text_bytes(pattern(8)), pattern(8))
decoded("no_shape_none", "int16", [], "dtype: DT_INT16", pack("int16", [0]))
decoded("no_shape_string", "string", [], 'dtype: DT_STRING string_val: "only"', [b"only"])
decoded("no_shape_string_none", "string", [], "dtype: DT_STRING", [b""])
# unknown_rank: TensorShape (not PartialTensorShape) ignores it and takes the dims as they are.
decoded("unknown_rank_scalar", "float32", [],
        "dtype: DT_FLOAT tensor_shape { unknown_rank: true } float_val: 1", pack("float32", [1]))
decoded("unknown_rank_dims", "int32", [2],
        "dtype: DT_INT32 tensor_shape { unknown_rank: true dim { size: 2 } } int_val: 7 int_val: 8",
        pack("int32", [7, 8]))
decoded("unknown_rank_string", "string", [1],
        'dtype: DT_STRING tensor_shape { unknown_rank: true dim { size: 1 } } string_val: "x"',
        [b"x"])

# No elements (a dimension is 0): TensorFlow reads neither tensor_content nor the values.
decoded("empty_with_content", "int32", [0, 3], "dtype: DT_INT32 %s tensor_content: %s" %
        (shape_text([0, 3]), text_bytes(pattern(5))), b"")
decoded("empty_with_values", "float32", [2, 0], "dtype: DT_FLOAT %s float_val: 1 float_val: 2" %
        shape_text([2, 0]), b"")
strings_read("empty_with_strings", [0], 'string_val: "a"', [])
decoded("empty_with_bool_content", "bool", [0], "dtype: DT_BOOL %s tensor_content: \"\\002\"" %
        shape_text([0]), b"")


def varint(n):
    out = b""
    while n >= 0x80:
        out += bytes([(n & 0x7F) | 0x80])
        n >>= 7
    return out + bytes([n])


def string_list(strs):
    """TensorFlow's tensor_content for strings (port::EncodeStringList): the lengths as
    varints, then the bytes."""
    return b"".join(varint(len(x)) for x in strs) + b"".join(strs)


# Strings in tensor_content, which TensorFlow reads before string_val (Helper<tstring>::Decode).
SLIST = [b"", b"hi", bytes(range(200))]
strings_read("string_content_vector", [3], "tensor_content: " + text_bytes(string_list(SLIST)),
             SLIST)
decoded("string_content_scalar", "string", [],
        "dtype: DT_STRING tensor_content: " + text_bytes(string_list([b"abc"])), [b"abc"])
strings_read("string_content_first", [1], "tensor_content: %s string_val: \"no\"" %
             text_bytes(string_list([b"yes"])), [b"yes"])
strings_read("string_content_long_varint", [2],  # lengths need not be in their shortest form
             "tensor_content: " + text_bytes(b"\x80\x80\x80\x80\x00\x81\x00" + b"z"),
             [b"", b"z"])
strings_read("empty_with_string_content", [0, 2], "tensor_content: \"junk\"", [])

bad = []  # (name, text, unsupported): TensorProtos that TensorFlow refuses, and tfab with it


def refused(name, text, unsupported=False):
    bad.append((name, text, unsupported))


# tensor_content must be exactly the elements' bytes (tensor.cc, Helper<T>::Decode).
refused("content_size_short", "dtype: DT_INT32 %s tensor_content: %s" %
        (shape_text([2]), text_bytes(pattern(7))))
refused("content_size_long", "dtype: DT_INT32 %s tensor_content: %s" %
        (shape_text([2]), text_bytes(pattern(9))))
refused("content_size_scalar", "dtype: DT_DOUBLE %s tensor_content: %s" %
        (shape_text([]), text_bytes(pattern(4))))
# Strings in tensor_content whose lengths are not the content's (port::DecodeStringList).
for name, content in [("short", string_list([b"ab", b"c"])[:-1]),
                      ("long", string_list([b"ab", b"c"]) + b"d"),
                      ("cut_length", b"\x02\x80"),
                      ("length_too_long", b"\x80\x80\x80\x80\x80\x00" + b"ab"),
                      ("fewer_lengths", b"\x00")]:
    refused("string_content_" + name, "dtype: DT_STRING %s tensor_content: %s" %
            (shape_text([2]), text_bytes(content)))
# A bool tensor_content byte other than 0 and 1 (Helper<bool>::Decode checks each one).
refused("bool_content_2", "dtype: DT_BOOL %s tensor_content: \"\\000\\001\\002\"" % shape_text([3]))
refused("bool_content_ff", "dtype: DT_BOOL %s tensor_content: \"\\377\"" % shape_text([]))
# Shapes TensorShape::IsValid refuses, and DT_INVALID.
refused("shape_negative", "dtype: DT_FLOAT tensor_shape { dim { size: 2 } dim { size: -1 } }")
refused("shape_overflow", "dtype: DT_FLOAT " + shape_text([1 << 32, 1 << 32]))
refused("dtype_invalid", "dtype: DT_INVALID " + shape_text([1]), unsupported=True)
refused("dtype_invalid_empty", "", unsupported=True)  # no field at all: a DT_INVALID scalar


def encode(protoc, proto, text):
    include = proto.rsplit("/", 1)[0] if "/" in proto else "."
    out = subprocess.run([protoc, "--encode=tensorflow.TensorProto", "-I" + include, proto],
                         input=text.encode(), capture_output=True, check=False)
    if out.returncode != 0:
        sys.exit("protoc failed on %r: %s" % (text, out.stderr.decode()))
    return out.stdout


def c_bytes(b):
    return "{" + (", ".join("0x%02x" % x for x in b) or "0") + "}"


def main():
    protoc, proto, output = sys.argv[1:4]
    lines = ["/* Generated by test/proto/vectors.py from protoc --encode: do not edit. */",
             "#include <stdbool.h>", "#include <stddef.h>", "#include <stdint.h>", "",
             "struct tp_str { const char *data; size_t len; };", "",
             "struct tp_vector {", "\tconst char *name;", "\tbool strings, encode;",
             "\tuint8_t code, bits;", "\tint ndim;", "\tint64_t shape[4];",
             "\tconst uint8_t *proto;", "\tsize_t proto_len;",
             "\tconst uint8_t *content; /* numeric: the raw content */",
             "\tsize_t content_len;", "\tconst struct tp_str *strs; /* strings */",
             "\tsize_t nstrs;", "};", ""]
    table = []
    for i, (name, kind, shape, text, expect, enc) in enumerate(cases):
        raw = encode(protoc, proto, text)
        lines.append("static const uint8_t tp_proto_%d[] = %s;" % (i, c_bytes(raw)))
        if kind == "string":
            strs = ", ".join("{\"%s\", %d}" % ("".join("\\%03o" % x for x in s), len(s))
                             for s in expect) or "{NULL, 0}"
            lines.append("static const struct tp_str tp_strs_%d[] = {%s};" % (i, strs))
            table.append("\t{\"%s\", true, %s, 0, 0, %d, {%s}, tp_proto_%d, %d, NULL, 0, "
                         "tp_strs_%d, %d}," % (name, "true" if enc else "false", len(shape),
                                              ", ".join(map(str, shape)) or "0", i, len(raw),
                                              i, len(expect)))
        else:
            code, bits = KINDS[kind][0], KINDS[kind][1]
            lines.append("static const uint8_t tp_content_%d[] = %s;" % (i, c_bytes(expect)))
            table.append("\t{\"%s\", false, %s, %d, %d, %d, {%s}, tp_proto_%d, %d, "
                         "tp_content_%d, %d, NULL, 0}," %
                         (name, "true" if enc else "false", code, bits, len(shape),
                          ", ".join(map(str, shape)) or "0", i, len(raw), i, len(expect)))
    lines += ["", "static const struct tp_vector tp_vectors[] = {"] + table + ["};", ""]
    lines += ["/* TensorProtos to refuse: -TFAB_ERR_PROTOCOL, or -EOPNOTSUPP when unsupported. */",
              "struct tp_bad {", "\tconst char *name;", "\tconst uint8_t *proto;",
              "\tsize_t proto_len;", "\tbool unsupported;", "};", ""]
    table = []
    for i, (name, text, unsupported) in enumerate(bad):
        raw = encode(protoc, proto, text)
        lines.append("static const uint8_t tp_bad_%d[] = %s;" % (i, c_bytes(raw)))
        table.append("\t{\"%s\", tp_bad_%d, %d, %s}," %
                     (name, i, len(raw), "true" if unsupported else "false"))
    lines += ["", "static const struct tp_bad tp_bad[] = {"] + table + ["};", ""]
    with open(output, "w") as f:
        f.write("\n".join(lines))


main()
