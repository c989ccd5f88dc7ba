"""LoRA adaptation: ``genaug adapt``'s work, below the commands and above the pipeline and judge.

By job: :mod:`.data` reads ``DATA/<label>/*`` (training examples, the judge's shots),
:mod:`.train` trains the LoRA on the served model, :mod:`.check` draws every label with it and
scores the images (cross-validation, the calibrated bar), :mod:`.report` turns the figures into
the table, the verdict line and the sheet. The LoRA file's header (what training writes and
serving checks) is :mod:`genaug.service.pipeline.lora_record`, below both.
:mod:`genaug.service.commands.adapt` only parses, calls and prints. Nothing is imported here,
so importing one module costs only its own imports (``genaug --help`` loads no torch).
"""
