from __future__ import annotations

import ductor_routing


def test_public_face_names_its_version() -> None:
    assert ductor_routing.__version__ == "0.1.0"
    assert "__version__" in ductor_routing.__all__
