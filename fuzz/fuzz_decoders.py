"""Coverage-guided fuzzing of the decoders a peer can reach, with atheris.

    pip install atheris
    python fuzz/fuzz_decoders.py -max_total_time=600 fuzz/corpus

Without atheris, ``python fuzz/fuzz_decoders.py FILE...`` replays inputs (e.g. a crash found
elsewhere) through the same target. A finding is any exception other than the protocol's own
errors (MalformedMessageError, FrameError).
"""

from __future__ import annotations

import sys

from bookkeeper_py.wire import v2, v3
from bookkeeper_py.wire.availability import AvailableEntries
from bookkeeper_py.wire.errors import MalformedMessageError
from bookkeeper_py.wire.framing import FrameDecoder, FrameError


def test_one_input(data: bytes) -> None:
    decoder = FrameDecoder(max_frame_size=1 << 16)
    try:
        frames = decoder.feed(data)
    except FrameError:
        frames = []
    for frame in [data, *frames]:
        for decode in (
            v2.decode_request,
            v2.decode_response,
            v2.decode_auth,
            v3.decode_request,
            v3.decode_response,
            AvailableEntries.decode,
        ):
            try:
                decode(frame)
            except MalformedMessageError:
                pass
        v3.is_v3_request(frame)


def main() -> None:
    try:
        import atheris
    except ImportError:
        for path in sys.argv[1:]:
            with open(path, "rb") as handle:
                test_one_input(handle.read())
        print(f"replayed {len(sys.argv) - 1} inputs without a finding (atheris is not installed)")
        return
    atheris.instrument_all()
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
