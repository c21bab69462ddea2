# Model weights: hub repositories downloaded once into resources/ (compute nodes often have no
# network), and tiny randomly initialised models built locally for the demo and smoke tests.


rule download_model:
    output:
        model=directory("resources/models/hub/{repo}"),
    log:
        "logs/download_model/{repo}.log",
    params:
        repo_id=lambda wc: wc.repo.replace("--", "/", 1),
        version=VERSION,
    script:
        "../scripts/download_model.py"


rule build_tiny_model:
    output:
        model=directory("results/models/tiny/{kind}"),
    log:
        "logs/build_tiny_model/{kind}.log",
    params:
        seed=0,
        version=VERSION,
    script:
        "../scripts/build_tiny_model.py"
