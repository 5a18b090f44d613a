"""The course's committed experiments: the commands that run them and write their ``results/``
JSON. A learner reads those files through the readers that stay in the library
(``methods.table.load_table``, ``kmix_table.load_table``, ``sensitivity.load_scan``,
``qat.load_results``) and need not open this folder. It sits above the library, its checks and
its widgets, so none of them imports a writer (``tests/test_imports.py``; only the course's
machinery, ``course_lib.authoring``, sits higher), and the readers keep no writer
(``tests/test_experiments.py``).

- ``methods_table``     RTN, GPTQ (with and without act-order) and AWQ on one model:
                        ``results/methods_<model>.json`` (lessons 06, 07, 12)
- ``sensitivity_scan``  the per-tensor sensitivity scan of SmolLM2:
                        ``results/kquants_sensitivity_smollm2.json`` (lesson 14)
- ``kmix_table``        llama.cpp's mixes, the importance matrix and the course's allocation run
                        in the engine: ``results/kquants_engine_smollm2.json`` (lesson 14)
- ``qat_tables``        quantization-aware training, bundled model and SmolLM2 block by block:
                        ``results/qat_bundled.json``, ``results/qat_smollm2.json`` (lesson 15)

    python -m course_lib.experiments.methods_table --model bundled
    python -m course_lib.experiments.sensitivity_scan scan
    python -m course_lib.experiments.kmix_table        # after the scan
    python -m course_lib.experiments.qat_tables --model bundled

The bundled methods table takes about a minute on 2 cores, the others tens of minutes or more;
``--help`` lists each one's options.
"""
