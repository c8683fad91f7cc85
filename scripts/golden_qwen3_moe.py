#!/usr/bin/env python3
# Golden fixtures for Qwen3-MoE (tests/fixtures/golden/qwen3_tiny_*), made on the H200 with
# transformers 5.17 (CPU, float32): python3 scripts/golden_qwen3_moe.py OUT_DIR (or
# make_golden.py --family qwen3_moe). Per fixture: HF's own seeded init of Qwen3MoeForCausalLM
# (norm weights 1 + 0.1 N(0,1)) -> hub-named tensors (HF's fused experts split back into
# mlp.experts.{e}.gate_proj/up_proj/down_proj; dense layers mlp.gate_proj/...; router mlp.gate;
# per-head q_norm/k_norm [head_dim]); bf16, or FP8 e4m3 with f32 weight_scale_inv per block as
# Qwen ships it (router, norms, embeddings, lm_head unquantised) -> transformers reloads a
# dequantised float32 hub-named copy (its own checkpoint conversion) -> greedy generation:
# golden.json (prompt, generated ids), ref_logits.npy [8, V], ref_full_logits.npy (one forward
# over prompt + generated[:-1]). The fixtures: bf16 with a dense middle layer (mlp_only_layers)
# and top-level rope_theta; FP8 128x128 with partial edge blocks, decoder_sparse_step 2,
# transformers v5 rope_parameters, top-k not renormalised; YaRN x4 (rope_parameters) with MQA.
# The code below was sent to the device byte for byte (it had to fit one command line).
import json,os,sys,torch,numpy as np,transformers as T
from safetensors.torch import save_file
from make_golden import quantize_fp8,write_sharded
K='hidden_size num_hidden_layers num_attention_heads num_key_value_heads head_dim moe_intermediate_size intermediate_size num_experts'.split()
A=dict(architectures=['Qwen3MoeForCausalLM'],model_type='qwen3_moe',num_experts_per_tok=2,
 initializer_range=.1,vocab_size=1000)
F={'qwen3_tiny_bf16':(31,None,7,(128,3,4,2,32,64,96,8),dict(norm_topk_prob=True,mlp_only_layers=[1],rope_theta=1e6)),
 'qwen3_tiny_fp8':(32,[128,128],7,(192,2,4,2,48,160,224,8),dict(decoder_sparse_step=2,
  rope_parameters=dict(rope_type='default',rope_theta=1e6),quantization_config=dict(
  activation_scheme='dynamic',fmt='e4m3',quant_method='fp8',weight_block_size=[128,128]))),
 'qwen3_tiny_yarn':(33,None,20,(64,1,4,1,16,32,32,4),dict(max_position_embeddings=256,rope_parameters=dict(rope_type='yarn',rope_theta=1e4,factor=4.,original_max_position_embeddings=64)))}
for n,(s,q,P,z,c) in F.items():
 c={**A,**dict(zip(K,z)),**c};d=f'{sys.argv[1]}/{n}';r=d+'_hf';os.makedirs(d);os.makedirs(r)
 torch.manual_seed(s);m=T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(**c));st,v={},{}
 def put(t,y):
  if q and t.endswith('proj.weight'):st[t],st[t+'_scale_inv'],v[t]=quantize_fp8(y,q)
  else:st[t]=y.to(getattr(torch,c.get('torch_dtype','bfloat16')));v[t]=st[t].float()
 for k,w in m.state_dict().items():
  w=w.float()
  if 'norm' in k:w=1+.1*torch.randn_like(w)
  if w.dim()<3:put(k,w);continue
  for e,x in enumerate(w):
   for y,u in zip(x.chunk(2),('gate','up'))if'gate_up'in k else[(x,'down')]:put(k.split('experts.')[0]+f'experts.{e}.{u}_proj.weight',y)
 write_sharded(d,st);json.dump(c,open(d+'/config.json','w'),indent=1);c.pop('quantization_config',0)
 save_file(v,r+'/model.safetensors');json.dump(c,open(r+'/config.json','w'))
 m=T.Qwen3MoeForCausalLM.from_pretrained(r,dtype=torch.float32,attn_implementation='eager').eval()
 p=torch.randint(3,c['vocab_size'],(1,P),generator=torch.Generator().manual_seed(s))
 with torch.no_grad():
  o=m.generate(p,max_new_tokens=8,min_new_tokens=8,do_sample=False,output_logits=True,return_dict_in_generate=True)
  f=m(o.sequences[:,:-1]).logits[0].numpy()
 g=o.sequences[0,P:].tolist();L=torch.stack([x[0]for x in o.logits]).numpy();t=np.sort(L,1)
 np.save(d+'/ref_logits.npy',L);np.save(d+'/ref_full_logits.npy',f)
 json.dump(dict(prompt_ids=p[0].tolist(),generated_ids=g,reference='transformers '+T.__version__,min_argmax_margin=float((t[:,-1]-t[:,-2]).min())),open(d+'/golden.json','w'))
 print(n,g,t[:,-1]-t[:,-2])
