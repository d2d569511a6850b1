"""The GGUF file format: metadata, tensor table and raw tensor bytes, read through a memory map.

A GGUF file is a header (magic, version, counts), typed key/value metadata, a table of tensors
(name, shape, ggml type, offset) and then the aligned tensor data. This module only parses the
format; `llm/gguf.py` turns it into a Hugging Face config, tokenizer and state dict.

Parsing here is plain `struct` over a `numpy.memmap`: gguf-py's `GGUFReader` builds one numpy view
per array element, which takes about 10 s for a 262k-token vocabulary. Tensor bytes are returned as
views of the map, so nothing is read from disk until a tensor is dequantized.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from math import prod

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from vlchat.llm.errors import ModelLoadError

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32  # llama.cpp's default when general.alignment is absent

# metadata value type id -> struct format of the fixed-size scalar types
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True, slots=True)
class GGUFTensorInfo:
    """Where one tensor lives in the file. `shape` is in torch order (slowest dimension first)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the data section

    @property
    def nbytes(self) -> int:
        block_elements, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)]
        return prod(self.shape) // block_elements * block_bytes

    @property
    def byte_shape(self) -> tuple[int, ...]:
        """The shape of the raw bytes as gguf-py's `dequantize` expects them: rows of packed blocks."""
        block_elements, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)]
        return (*self.shape[:-1], self.shape[-1] // block_elements * block_bytes)


class GGUFFile:
    """One parsed GGUF file: `metadata` (key -> value), `tensors` (name -> info), raw tensor bytes."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._blob = np.memmap(path, mode="r", dtype=np.uint8)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot read the GGUF file {path}: {exc}; check the path") from exc
        try:
            self.metadata, pos = self._read_metadata()
            self.tensors, pos = self._read_tensor_table(pos)
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise ModelLoadError(f"{path} is not a valid GGUF file ({exc}); re-download or re-convert it") from exc
        alignment = int(self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        self._data_start = (pos + alignment - 1) // alignment * alignment

    @property
    def architecture(self) -> str:
        return self.metadata["general.architecture"]

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view shaped `info.byte_shape` (nothing is copied)."""
        info = self.tensors[name]
        start = self._data_start + info.offset
        end = start + info.nbytes
        if end > self._blob.shape[0]:
            raise ModelLoadError(f"{self.path} is truncated: tensor {name} ends past the end of the file")
        return self._blob[start:end].reshape(info.byte_shape)

    def _read_metadata(self) -> tuple[dict, int]:
        if bytes(self._blob[:4]) != _MAGIC:
            raise ValueError("it does not start with the GGUF magic bytes")
        version, self._tensor_count, kv_count = struct.unpack_from("<IQQ", self._blob, 4)
        if version not in _VERSIONS:
            raise ValueError(f"GGUF version {version} is not supported (only {_VERSIONS})")
        pos = 24
        metadata = {}
        for _ in range(kv_count):
            key, pos = self._read_string(pos)
            (value_type,) = struct.unpack_from("<I", self._blob, pos)
            metadata[key], pos = self._read_value(pos + 4, value_type)
        if "general.architecture" not in metadata:
            raise ValueError("its metadata has no general.architecture")
        return metadata, pos

    def _read_tensor_table(self, pos: int) -> tuple[dict[str, GGUFTensorInfo], int]:
        tensors = {}
        for _ in range(self._tensor_count):
            name, pos = self._read_string(pos)
            (n_dims,) = struct.unpack_from("<I", self._blob, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", self._blob, pos + 4)
            ggml_type, offset = struct.unpack_from("<IQ", self._blob, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            # ggml lists dimensions fastest-moving first; torch the other way round
            tensors[name] = GGUFTensorInfo(name, tuple(reversed(dims)), ggml_type, offset)
        return tensors, pos

    def _read_value(self, pos: int, value_type: int):
        if value_type in _SCALAR_FORMATS:
            fmt = "<" + _SCALAR_FORMATS[value_type]
            return struct.unpack_from(fmt, self._blob, pos)[0], pos + struct.calcsize(fmt)
        if value_type == _STRING:
            return self._read_string(pos)
        if value_type == _ARRAY:
            element_type, count = struct.unpack_from("<IQ", self._blob, pos)
            pos += 12
            if element_type in _SCALAR_FORMATS:
                fmt = f"<{count}{_SCALAR_FORMATS[element_type]}"
                return list(struct.unpack_from(fmt, self._blob, pos)), pos + struct.calcsize(fmt)
            values = []
            for _ in range(count):
                value, pos = self._read_value(pos, element_type)
                values.append(value)
            return values, pos
        raise ValueError(f"unknown metadata value type {value_type}")

    def _read_string(self, pos: int) -> tuple[str, int]:
        (length,) = struct.unpack_from("<Q", self._blob, pos)
        pos += 8
        return bytes(self._blob[pos : pos + length]).decode("utf-8"), pos + length
