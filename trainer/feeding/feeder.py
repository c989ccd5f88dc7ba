"""Keep a :class:`~genaug.trainer.mixing.reservoir.SyntheticReservoir` fresh from the genaug
service: :class:`ReservoirFeeder`, the shared :class:`~genaug.feeding.feeder.Feeder` with what a
Keras run adds.

Everything the feeder does between start and stop, its strict first-contact checks included,
is the shared feeder's (:mod:`genaug.feeding`, which ``genaug.torch`` runs too). A
``ReservoirFeeder`` adds :meth:`~ReservoirFeeder.callback` (a Keras callback that starts it
when ``fit`` begins and stops it when ``fit`` ends) and, at first contact, a loud warning when
TensorFlow in this process can use the generator's GPU.

Importing this module imports neither TensorFlow nor torch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from genaug.feeding.cycle import FeederStats
from genaug.feeding.feeder import Feeder
from genaug.feeding.preflight import FeederConfigError, first_contact_problems

# FeederConfigError, first_contact_problems and FeederStats (genaug.feeding) are re-exported
# here, where TensorFlow feeder users import them.
__all__ = ["FeederConfigError", "FeederStats", "ReservoirFeeder", "first_contact_problems"]

log = logging.getLogger(__name__)


class ReservoirFeeder(Feeder):  # type: ignore[misc]  # mypy sees genaug.feeding as Any
    """Daemon thread that refills a :class:`~genaug.trainer.mixing.reservoir.SyntheticReservoir`
    from the genaug service; its arguments are :class:`~genaug.feeding.feeder.Feeder`'s.

    Example::

        reservoir = SyntheticReservoir(2, 256, (64, 64, 3))
        feeder = ReservoirFeeder(reservoir, url="http://gen-host:8000", recipe="wounds",
                                 label_map={"healthy": 0, "ulcer": 1})
        model.fit(ds.map(reservoir.mix(p=0.5)), callbacks=[feeder.callback()])
        feeder.stats.images_received

    With ``match=shots`` (your real training images, uint8 ``[N, 28, 28, 1]`` say) the
    reservoir is built at their shape, ``SyntheticReservoir(2, 256, shots.shape[1:])``, and
    every pool image reaches it framed, sized and lit as they are.
    """

    def callback(self) -> Any:
        """A Keras callback that starts the feeder at ``on_train_begin`` and stops it at
        ``on_train_end`` (only if it started it there).

        Example::

            model.fit(ds, epochs=5, callbacks=[feeder.callback()])
        """
        from .callback import feeder_callback  # Keras, imported when a callback is asked for

        return feeder_callback(self)

    def _service_info(self, info: Mapping[str, Any], where: str) -> None:
        warn_if_tensorflow_sees_generator_gpu(info, where)


def warn_if_tensorflow_sees_generator_gpu(info: Mapping[str, Any], where: str) -> None:
    """Log a loud warning when TensorFlow in this process can use the generator's GPU
    (:func:`~genaug.trainer.hardware.devices.tensorflow_sees_service_gpu`); never raises."""
    from ..hardware.devices import tensorflow_sees_service_gpu

    try:
        warning = tensorflow_sees_service_gpu(info, where)
    except Exception:  # a warning must never stop the feeder
        log.debug("could not compare TensorFlow's GPUs with the service's", exc_info=True)
        return
    if warning:
        log.warning("!" * 78 + "\n%s\n" + "!" * 78, warning)
