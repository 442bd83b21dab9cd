# One run: the two textbook adapters (docs/examples) trained 40 steps, exported, verified on CUDA (fp32 and fp16)
# against the user's function, translated on CUDA and on the CPU (same text?), alone and batched.
set -u
T0=$(date +%s); mkdir -p $OUT; exec > >(tee $OUT/run.log) 2>&1
PROVIDER=${PROVIDER:-cuda}
[ -e toolkit/models ] || ln -s ../models toolkit/models
if [ "${KIT:-1}" = 1 ] && [ -d .gpukit/p00 ]; then mkdir -p /tmp/site && cat .gpukit/p00/part* .gpukit/p01/part* .gpukit/p02/part* | xz -d | tar -x -C /tmp/site; fi
if [ "${KIT:-1}" = 1 ]; then python3 -m zipfile -e .cudawork/sentencex-*.whl /tmp/site; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -c "
import importlib, re, tomllib
deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']
for d in deps:
    name = re.split('[<>=!\\[ ;]', d)[0].replace('-', '_')
    name = {'onnxruntime_gpu': 'onnxruntime'}.get(name, name)
    try: importlib.import_module(name)
    except Exception as e: print('MISSING', d, e)
"
echo "unpacked after $(( $(date +%s) - T0 )) s"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null; nproc
python3 -c "import sys,torch,onnx,onnxruntime as o;o.preload_dlls() if hasattr(o,'preload_dlls') else None;print(sys.version.split()[0],'torch',torch.__version__,torch.cuda.is_available(),'onnx',onnx.__version__,'ort',o.__version__,o.get_available_providers())"
W=/tmp/adapters; rm -rf $W; mkdir -p $W
printf '%s\n' "Go." "I'm home." "Where is the station?" "He's calm." "We won." "Tom is tall." "I like tea." "Come here." "The cat is here." "Where is Tom?" > $W/ten.txt
for i in 1 2 3 4 5; do cat $W/ten.txt; done > $W/fifty.txt
for name in d2l_gru_attention pre_ln_transformer; do
  echo "=== $name"
  python3 -c "
import importlib.util, sys
spec = importlib.util.spec_from_file_location('ex', 'docs/examples/$name.py'); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
m.train(__import__('pathlib').Path('$W/run-$name'), steps=40)" || continue
  export TK_EXAMPLE_RUN=$W/run-$name
  python3 -m toolkit.cli export docs/examples/$name.py:build --out $W/$name --fp16 || continue
  timeout 150 python3 -m toolkit.cli verify $W/$name --checkpoint docs/examples/$name.py:build --provider $PROVIDER --variant fp32 --variant fp16 --sentences 8 --json $OUT/verify-$name-$PROVIDER.json
  echo "verify exit $?"
  python3 -m toolkit.cli translate --model $W/$name --provider $PROVIDER -i $W/fifty.txt -o $W/$name-$PROVIDER.txt; echo "translate $PROVIDER exit $?"
  python3 -m toolkit.cli translate --model $W/$name --provider cpu -i $W/fifty.txt -o $W/$name-cpu.txt; echo "translate cpu exit $?"
  python3 -m toolkit.cli translate --model $W/$name --provider $PROVIDER --variant fp16 -i $W/fifty.txt -o $W/$name-$PROVIDER-fp16.txt; echo "translate $PROVIDER fp16 exit $?"
  python3 -c "
a=open('$W/$name-$PROVIDER-fp16.txt').read().splitlines(); b=open('$W/$name-cpu.txt').read().splitlines()
print('$name: fp16 on $PROVIDER vs fp32 on cpu identical lines', sum(x==y for x,y in zip(a,b)), 'of', len(b), 'non-empty', sum(map(bool,a)), sum(map(bool,b)))"
  cp $W/$name-$PROVIDER-fp16.txt $W/$name-$PROVIDER.txt $W/$name-cpu.txt $OUT/ 2>/dev/null
  python3 -c "
a=open('$W/$name-$PROVIDER.txt').read().splitlines(); b=open('$W/$name-cpu.txt').read().splitlines()
print('$name: $PROVIDER vs cpu identical lines', sum(x==y for x,y in zip(a,b)), 'of', len(b), '; batched fifty = five times the first ten:', a==a[:10]*5)
from toolkit import Translator
t = Translator('$W/$name', provider='$PROVIDER'); alone=[t.translate([l])[0] for l in open('$W/ten.txt').read().splitlines()]
print('$name: alone == batched on $PROVIDER:', alone*5 == a, alone[:3])"
done
echo "done after $(( $(date +%s) - T0 )) s"
