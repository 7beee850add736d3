# compare.py BASE NEW: the two capture.sh output folders, event by event
# (samples and timings left out); prints IDENTICAL/DIFFERENT per run.
import json,sys,os,re,csv
def norm(t): 
    t=re.sub(r'/tmp/[^ ]*prunemem-[a-z]+-[A-Za-z0-9]+','/tmp/SCRATCH',t)
    return t.replace('/tmp/cap/base','X').replace('/tmp/cap/new','X').replace('base-prunemem','BIN').replace('new-prunemem','BIN')
def sig(d):
    out=[]
    p=os.path.join(d,'events.jsonl')
    for line in open(p):
        e=json.loads(line); k=e['event']
        if k=='sample': continue
        if k=='stage': out.append((k,e['snapshot']['label']))
        elif k=='scope_begin': out.append((k,e['label']))
        elif k=='scope_end': out.append((k,e['report']['label']))
        elif k=='progress': out.append((k,e['index'],e['total'],e['name']))
        elif k=='message': out.append((k,e['level'],norm(e['text'])))
        elif k=='components': out.append((k,e['stage'],tuple(sorted(e['bytes'].keys()))))
        elif k=='run_started':
            pl=e['plan']; out.append((k,pl['command'],norm(' '.join(pl['argv'])),norm(json.dumps(pl['settings'],sort_keys=True)),pl['method']))
        elif k=='run_finished':
            s=e['summary']; r=s['results']
            keep={kk:(vv if not ('seconds' in kk or 'per_second' in kk) else 'T') for kk,vv in r.items()}
            if 'iterations' in keep: keep['iterations']=[{a:b for a,b in it.items() if a!='seconds'} for it in keep['iterations']]
            out.append((k,json.dumps(s['status']),json.dumps(keep,sort_keys=True)))
        else: out.append((k,))
    rows=[r[1] for r in csv.reader(open(os.path.join(d,'memory_log.csv')))]
    return out,rows
a,b=sys.argv[1],sys.argv[2]
dirs=sorted(x for x in os.listdir(a) if os.path.isdir(os.path.join(a,x)) and os.path.exists(os.path.join(a,x,'events.jsonl')))
ok=True
for d in dirs:
    sa,ra=sig(os.path.join(a,d)); sb,rb=sig(os.path.join(b,d))
    same = sa==sb and ra==rb
    print(f"{d:20s} events {len(sa):4d} csv rows {len(ra):3d} {'IDENTICAL' if same else 'DIFFERENT'}")
    if not same:
        ok=False
        for i,(x,y) in enumerate(zip(sa,sb)):
            if x!=y: print('  first diff at',i,'\n   base:',x,'\n   new: ',y); break
        if len(sa)!=len(sb): print('  lengths',len(sa),len(sb))
        if ra!=rb: print('  csv differs', ra, rb)
print('ALL IDENTICAL' if ok else 'DIFFERENCES')
